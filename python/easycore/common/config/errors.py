"""The exceptions raised by :mod:`easycore.common.config`.

Each one is an :class:`~easycore.errors.EasycoreError` and also the stdlib exception that code
written for plain dicts, yacs or PyYAML already catches.
"""

from __future__ import annotations

import yaml

from easycore.errors import EasycoreError


class ConfigError(EasycoreError):
    """Root of the config errors."""


class ConfigKeyError(ConfigError, KeyError):
    """A key is missing (item access, ``pop``, ``del``) or refused by strict mode.

    The message names the full key path, e.g. ``MODEL.NUM_CLASES``, and the closest existing key.
    """

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class ConfigAttributeError(ConfigError, AttributeError):
    """A key is missing on attribute access (``cfg.MODEL.NUM_CLASES``), so ``hasattr`` works."""


class FrozenConfigError(ConfigError, AttributeError):
    """A frozen CfgNode was asked to change (set, delete, update, pop, merge, ...).

    An ``AttributeError``, as in yacs; the message names the full key path.
    """


class InvalidConfigError(ConfigError, ValueError):
    """The content of a config is wrong: a key that is not an identifier, a YAML file that
    cannot be loaded or whose top level is not a mapping, a ``__BASE__`` cycle, a malformed
    override list, an override whose value does not fit the key's type."""


class InvalidYAMLError(InvalidConfigError, yaml.YAMLError):
    """A YAML text cannot be read: a syntax error, a key given twice, aliases that expand
    past the limit. The message names the file and the line; it is also a ``yaml.YAMLError``
    for code that catches PyYAML's errors."""


class UnsafeYAMLError(InvalidConfigError, yaml.YAMLError):
    """A YAML text uses a tag that can run code (``!!python/...``) and the caller did not opt in
    with ``unsafe=True``."""


class BaseConfigNotFoundError(ConfigError, FileNotFoundError):
    """The file named by a ``__BASE__`` key exists neither relative to the including file nor as
    given."""


__all__ = [
    "BaseConfigNotFoundError",
    "ConfigAttributeError",
    "ConfigError",
    "ConfigKeyError",
    "FrozenConfigError",
    "InvalidConfigError",
    "InvalidYAMLError",
    "UnsafeYAMLError",
]
