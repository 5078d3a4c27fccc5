"""Builtins the rank layer wraps (`open`, `time.sleep`; on the simulated side the clocks
`time.monotonic`, `time.localtime`, `time.strftime`), held as class attributes and called
through an instance: a builtin never binds, so each gets its own arguments. Any world size.

    python class_attr_builtins.py OUT_DIR   # torchrun-style
"""
import os
import sys
import time

import torch.distributed as dist


class Saver:
    opener = open
    wait = time.sleep
    clock = time.monotonic
    converter = time.localtime  # (as logging.Formatter's)
    stamp = time.strftime

    def save(self, path: str) -> None:
        self.wait(0.01)
        assert self.clock() > 0 and self.converter(0).tm_year >= 1969 and len(self.stamp("%Y")) == 4
        with self.opener(path, "w") as f:
            f.write("x")


dist.init_process_group("gloo")
rank = dist.get_rank()
Saver().save(os.path.join(sys.argv[1], f"saved{rank}.txt"))
dist.barrier()
print(rank, "saved")
dist.destroy_process_group()
