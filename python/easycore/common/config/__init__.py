"""Light weight config tools: :class:`CfgNode` and :class:`HierarchicalCfgNode`.

Example::

    from easycore.common.config import CfgNode as CN

    cfg = CN.open("example.yaml")
    cfg.SOLVER = CN()
    cfg.SOLVER.LEARNING_RATE = 0.001
    cfg.save("example-save.yaml")
"""

from easycore.common.config.errors import (
    BaseConfigNotFoundError,
    ConfigAttributeError,
    ConfigError,
    ConfigKeyError,
    FrozenConfigError,
    InvalidConfigError,
    InvalidYAMLError,
    UnsafeYAMLError,
)
from easycore.common.config.hierarchical import HierarchicalCfgNode
from easycore.common.config.node import CfgNode

__all__ = [
    "BaseConfigNotFoundError",
    "CfgNode",
    "ConfigAttributeError",
    "ConfigError",
    "ConfigKeyError",
    "FrozenConfigError",
    "HierarchicalCfgNode",
    "InvalidConfigError",
    "InvalidYAMLError",
    "UnsafeYAMLError",
]
