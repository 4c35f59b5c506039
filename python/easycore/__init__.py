"""easycore: spread work over CPU and GPU processes, plus the small tools ML pipelines need.

Subpackages:

* :mod:`easycore.common.parallel` — ``UnorderedRunner`` / ``OrderedRunner`` on a Rust
  shared-memory core.
* :mod:`easycore.torch.parallel` — the same runners on ``torch.multiprocessing``.
* :mod:`easycore.common.config` — ``CfgNode`` and ``HierarchicalCfgNode``.
* :mod:`easycore.common.registry` — ``Registry``.
* :mod:`easycore.common.path` — ``PathManager`` and path handlers, ``file_lock``.
* :mod:`easycore.common.network` — ``download_file``.
* :mod:`easycore.errors` — every exception easycore raises, under ``EasycoreError``.
"""

from easycore import errors
from easycore.errors import EasycoreError

__version__ = "0.1.0"

__all__ = ["EasycoreError", "__version__", "errors"]
