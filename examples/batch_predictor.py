"""The manual's Example 3: process data in batches with easycore.torch.parallel.

As in the manual (its `Rredictor` typo fixed), on every GPU found, or two CPU producers.
"""

import torch
from easycore.common.config import CfgNode  # noqa: F401 - as in the manual
from easycore.torch.parallel import OrderedRunner
from network import Net


def batch_generator(data_list, batch_size):
    for i in range(0, len(data_list), batch_size):
        data_batch = data_list[i : i + batch_size]
        yield data_batch


class Predictor(OrderedRunner):
    @staticmethod
    def producer_init(device, cfg):
        cfg.model = Net()
        cfg.model.to(device)

    @staticmethod
    def producer_work(device, cfg, data):
        with torch.no_grad():
            data = torch.Tensor(data).view(-1, 1)
            data = data.to(device)
            output = cfg.model(data)
            output = output.cpu()
        return output

    @staticmethod
    def producer_end(device, cfg):
        del cfg.model

    @staticmethod
    def consumer_init(cfg):
        cfg.data_list = []

    @staticmethod
    def consumer_work(cfg, data):
        cfg.data_list.append(data)

    @staticmethod
    def consumer_end(cfg):
        data = torch.cat(cfg.data_list, dim=0)
        return data


if __name__ == "__main__":
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())][:2] or ["cpu", "cpu"]
    predictor = Predictor(devices=devices)

    data_list = list(range(100))
    result = predictor(batch_generator(data_list, batch_size=10))
    print(result.shape)

    predictor.close()
