"""The manual's Example 4: pass outside parameters into a runner through cfg."""

from easycore.common.config import CfgNode as CN
from easycore.common.parallel import UnorderedRunner


class Runner(UnorderedRunner):
    @staticmethod
    def producer_work(device, cfg, data):
        return data**cfg.exponent  # calculate power of data with outside parameter "exponent".

    @staticmethod
    def consumer_init(cfg):
        cfg.sum = 0  # init a sum variable with 0, you can use cfg to transfer data

    @staticmethod
    def consumer_work(cfg, data):
        cfg.sum += data  # add the square to the sum variable

    @staticmethod
    def consumer_end(cfg):
        return cfg.sum  # return the result you need


if __name__ == "__main__":
    # set parameters outside.
    cfg = CN()
    cfg.exponent = 3

    runner = Runner(devices=3, cfg=cfg)  # transfer `cfg` into the runner

    data_list = list(range(100))
    result = runner(data_list)
    print(result)

    runner.close()
