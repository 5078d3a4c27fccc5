"""A torchvision-references-style training loop: non-master ranks silenced by overriding
builtins.print (setup_for_distributed, `force=True` prints anyway), a MetricLogger whose
meters are synchronised with a barrier and an all_reduce of (count, total) in float64, and an
evaluation over a DistributedSampler(drop_last=False) that pads the last batch with repeated
samples: the summed sample count is compared with the data set's length and the user is
warned (the padded samples are counted twice).

    torchrun --nproc-per-node 3 examples/metric_logger_sync.py
    simdist compare examples/metric_logger_sync.py --nproc-per-node 3
"""

import argparse
import builtins
from collections import defaultdict, deque

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup_for_distributed(is_master):
    """Only the master prints, unless a call says force=True."""
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


class SmoothedValue:
    """A meter: a window for the median and the global count and total."""

    def __init__(self, window=20):
        self.deque, self.count, self.total = deque(maxlen=window), 0, 0.0

    def update(self, value, n=1):
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self):
        t = torch.tensor([self.count, self.total], dtype=torch.float64)
        dist.barrier()
        dist.all_reduce(t)
        self.count, self.total = int(t[0].item()), t[1].item()

    @property
    def global_avg(self):
        return self.total / self.count

    @property
    def median(self):
        return torch.tensor(list(self.deque)).median().item()


class MetricLogger:
    def __init__(self):
        self.meters = defaultdict(SmoothedValue)

    def update(self, n=1, **kwargs):
        for k, v in kwargs.items():
            self.meters[k].update(v.item() if torch.is_tensor(v) else v, n=n)

    def synchronize_between_processes(self):
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def __str__(self):
        return "  ".join(f"{k}: {m.median:.4f} ({m.global_avg:.4f})" for k, m in self.meters.items())


def reduce_across_processes(val):
    t = torch.tensor(val)
    dist.barrier()
    dist.all_reduce(t)
    return t


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--val", type=int, default=10)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    setup_for_distributed(rank == 0)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(5, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train, val = data(24, 1), data(args.val, 2)
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=4, sampler=sampler)
    val_loader = DataLoader(val, batch_size=3, sampler=DistributedSampler(val, shuffle=False))
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        logger = MetricLogger()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            logger.update(loss=loss, lr=opt.param_groups[0]["lr"])
        logger.synchronize_between_processes()
        print(f"epoch {epoch} train  {logger}")
        model.eval()
        logger, seen = MetricLogger(), 0
        with torch.no_grad():
            for x, y in val_loader:
                acc = (model(x).argmax(1) == y).float().mean()
                logger.update(n=len(x), acc1=acc)
                seen += len(x)
        print(f"rank {rank} evaluated {seen} samples", force=True)
        seen = reduce_across_processes(seen)
        if seen != len(val):
            print(f"WARNING: evaluated {int(seen)} samples, the data set has {len(val)}: padded samples counted twice")
        logger.synchronize_between_processes()
        print(f"epoch {epoch} acc1 {logger.meters['acc1'].global_avg:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
