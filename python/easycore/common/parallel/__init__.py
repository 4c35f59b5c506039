"""Multi-process runners on easycore's Rust shared-memory core.

Subclass :class:`UnorderedRunner` or :class:`OrderedRunner`, override the static hooks, and
call the runner on any iterable. See the README's architecture section for the data path.
"""

from easycore.common.parallel.engine import BaseRunner, OrderedRunner, RunnerStats, UnorderedRunner

__all__ = ["BaseRunner", "OrderedRunner", "RunnerStats", "UnorderedRunner"]
