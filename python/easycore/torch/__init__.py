"""Tools that need PyTorch (install with ``pip install easycore[torch]``)."""
