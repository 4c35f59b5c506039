"""Tools that need PyTorch (install with ``pip install 'easycore[torch]'``)."""

try:
    import torch as _torch  # noqa: F401  (checked here so the message names the extra)
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "easycore.torch needs PyTorch, which is not installed: pip install 'easycore[torch]' "
        "(or see https://pytorch.org for a CUDA build)",
        name="torch",
    ) from None
