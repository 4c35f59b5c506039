"""Network helpers: :func:`download_file`."""

from easycore.common.network.download import download_file
from easycore.common.path.errors import DownloadError

__all__ = ["DownloadError", "download_file"]
