"""The manual's Example 2: a neural-network predictor over several devices.

The manual uses four GPUs; this file uses every GPU it finds, or two CPU producers on a
machine without CUDA, and is otherwise the manual's code.
"""

import torch
from easycore.common.config import CfgNode  # noqa: F401 - as in the manual
from easycore.common.parallel import OrderedRunner
from network import Net


class Predictor(OrderedRunner):
    @staticmethod
    def producer_init(device, cfg):
        cfg.model = Net()  # init the producer with a model
        cfg.model.to(device)  # transfer the model to certain device

    @staticmethod
    def producer_work(device, cfg, data):
        with torch.no_grad():
            data = torch.Tensor([[data]])  # preprocess data
            data = data.to(device)  # transfer data to certain device
            output = cfg.model(data)  # predict
            output = output.cpu()  # transfer result to cpu
        return output

    @staticmethod
    def producer_end(device, cfg):
        del cfg.model  # delete the model when all data has been predicted.

    @staticmethod
    def consumer_init(cfg):
        cfg.data_list = []  # prepare a list to store all data from producers.

    @staticmethod
    def consumer_work(cfg, data):
        cfg.data_list.append(data)  # store data from producers.

    @staticmethod
    def consumer_end(cfg):
        data = torch.cat(cfg.data_list, dim=0)  # postprocess data.
        return data


if __name__ == "__main__":
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu", "cpu"]
    predictor = Predictor(devices=devices)  # init a parallel predictor

    data_list = list(range(100))  # prepare data
    result = predictor(data_list)  # predict
    print(result.shape)

    predictor.close()  # close the predictor when you no longer need it.
