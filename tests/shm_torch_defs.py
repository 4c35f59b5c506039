"""A torch runner whose producers build tensors with easycore.torch.shm (module level, so
spawned producers import it)."""

from __future__ import annotations

import runner_defs as rd
import torch
from easycore.torch import shm as tshm
from easycore.torch.parallel import UnorderedRunner


class TensorResults(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, i):
        t = tshm.empty(512, 256, dtype=torch.bfloat16 if i % 2 else torch.float32)
        t.fill_(i)
        z = tshm.zeros_like(t)
        return i, t, z

    consumer_init = rd.Collect.consumer_init
    consumer_work = rd.Collect.consumer_work
    consumer_end = rd.Collect.consumer_end
