"""A custom Joinable beside DDP under one Join: a running-loss metric that all-reduces
[loss_sum, count] every step; its join hook shadows that all_reduce with zeros once the rank
has run out of data, and its post-hook broadcasts the total from the last rank to join.
Rank r trains on 3 + r batches; every rank prints the same mean loss.

    torchrun --nproc-per-node 3 examples/join_custom_metric.py
    simdist compare examples/join_custom_metric.py --nproc-per-node 3
"""
import argparse
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.nn.parallel import DistributedDataParallel as DDP


class MetricHook(JoinHook):
    def __init__(self, metric):
        self.metric = metric

    def main_hook(self):
        t = torch.zeros(2)
        dist.all_reduce(t)
        self.metric.total += t

    def post_hook(self, is_last_joiner):
        dist.broadcast(self.metric.total, src=self.metric.last_joiner_rank(is_last_joiner))


class RunningLoss(Joinable):
    def __init__(self):
        super().__init__()
        self.total = torch.zeros(2)

    def update(self, loss):
        Join.notify_join_context(self)
        t = torch.tensor([loss, 1.0])
        dist.all_reduce(t)
        self.total += t

    def last_joiner_rank(self, is_last):
        r = torch.tensor([dist.get_rank() if is_last else -1])
        dist.all_reduce(r, op=dist.ReduceOp.MAX)
        return int(r.item())

    def join_hook(self, **kwargs):
        return MetricHook(self)

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", type=int, default=3)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metric = RunningLoss()
    g = torch.Generator().manual_seed(rank)
    with Join([model, metric]):
        for step in range(a.base + rank):
            x, y = torch.randn(2, 4, generator=g), torch.randn(2, 1, generator=g)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            metric.update(loss.item())
    print(f"[rank{rank}] mean loss {(metric.total[0] / metric.total[1]).item():.6f} over {int(metric.total[1].item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
