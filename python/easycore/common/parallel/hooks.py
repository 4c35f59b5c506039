"""The six hooks a runner subclass overrides, with the manual's defaults.

One place for them: :class:`~easycore.common.parallel.BaseRunner` inherits them, and the
benchmark's workloads use them as the base of their hook sets.
"""

from __future__ import annotations

from typing import Any

HOOK_NAMES = (
    "producer_init",
    "producer_work",
    "producer_end",
    "consumer_init",
    "consumer_work",
    "consumer_end",
)


class RunnerHooks:
    """The manual's default hooks: ``producer_work`` returns its data, the rest do nothing
    (``consumer_end`` returns None)."""

    @staticmethod
    def producer_init(device: str, cfg: Any) -> None:
        """Function for producer initialization.

        Args:
            device (str): device for the this process.
            cfg (easycore.common.config.CfgNode): config of this process, you can use it to
                transfer data to `producer_work` and `producer_end` function.
        """

    @staticmethod
    def producer_work(device: str, cfg: Any, data: Any) -> Any:
        """Function specify how the producer processes the data.

        Args:
            device (str): device for this process.
            cfg (easycore.common.config.CfgNode): config of this process, you can use it to
                get data from `producer_init` function and transfer data to the next
                `producer_work` and `producer_end` function.
            data (Any): data get from input of `__call__` method.

        Returns:
            Any: processed data
        """
        return data

    @staticmethod
    def producer_end(device: str, cfg: Any) -> Any:
        """Function after finishing all of its task and before close the process.

        Args:
            device (str): device for this process.
            cfg (easycore.common.config.CfgNode): config of this process, you can use it to
                get data from `producer_init` and `producer_work` function.

        Returns:
            Any: optional; what it returns (picklable) is in the runner's ``exit_results``
            after ``close()``.
        """

    @staticmethod
    def consumer_init(cfg: Any) -> None:
        """Function for consumer initialization.

        Args:
            cfg (easycore.common.config.CfgNode): config of this process, you can use it to
                transfer data to `consumer_work` and `consumer_end` function.
        """

    @staticmethod
    def consumer_work(cfg: Any, data: Any) -> None:
        """Function specify how the consumer processses the data from producers.

        Args:
            cfg (easycore.common.config.CfgNode): config of this process, you can use it to
                get data from `consumer_init` function and transfer data to the next
                `consumer_work` and `consumer_end` function.
        """

    @staticmethod
    def consumer_end(cfg: Any) -> Any:
        """Function after receiving all data from producers.

        Args:
            cfg (easycore.common.config.CfgNode): config of this process, you can use it get
                data from `consumer_work` function.

        Returns:
            Any: processed data
        """
        return None
