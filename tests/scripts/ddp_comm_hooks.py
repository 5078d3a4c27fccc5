"""A torchrun-style DDP script trying DDP's communication hooks, as people tune gradient
traffic: allreduce_hook, fp16_compress_hook, bf16_compress_hook, the fp16 wrapper around
allreduce, PowerSGD (rank 1, with warm-up steps and error feedback), and hooks of their own
returning a Future (an async all_reduce's future with a `then`, and a
torch.futures.Future they complete themselves). Losses and parameter digests printed.
Any world size >= 2.

    --powersgd   PowerSGD only: its all-reduces of P and Q are issued from `then` callbacks,
                 on whichever thread completed the future before (see the test)
"""

import argparse
import functools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP


def mean_then(state, bucket):
    """A user hook: all-reduce the bucket asynchronously and divide in a `then` callback."""
    work = dist.all_reduce(bucket.buffer(), group=state, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0] / dist.get_world_size())


def then_waits_on_others(state, bucket):
    """A user hook: three async all-reduces of the bucket's thirds; the first one's `then`
    callback waits on the other two's futures, got before it started (`wait()` and
    `torch.futures.wait_all`). On Gloo another worker thread completes them meanwhile."""
    buf = bucket.buffer()
    fa, fb, fc = (dist.all_reduce(part, async_op=True).get_future() for part in buf.tensor_split(3))

    def mean(_fut):
        fb.wait()
        torch.futures.wait_all([fc])
        return buf / dist.get_world_size()
    return fa.then(mean)


def max_done_by_hand(state, bucket):
    """A user hook that waits itself and hands DDP a completed Future (MAX, not a mean)."""
    t = bucket.buffer()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


def counted(hook, calls):
    """`hook`, counting its calls (one a bucket): the test wants several buckets a step."""
    @functools.wraps(hook)  # DDP refuses bf16 by the hook's name
    def run(state, bucket):
        calls.append(bucket.index())
        return hook(state, bucket)
    return run


def hooks(world):
    return [
        ("allreduce", None, default_hooks.allreduce_hook),
        ("fp16", None, default_hooks.fp16_compress_hook),
        ("bf16", None, default_hooks.bf16_compress_hook),
        ("fp16_wrapper", None, default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)),
        ("powersgd", powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=0.5,
                                            use_error_feedback=True, warm_start=True, random_seed=0),
         powersgd.powerSGD_hook),
        ("user_then", dist.group.WORLD, mean_then),
        ("user_waits", None, then_waits_on_others),
        ("user_done", None, max_done_by_hand),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--powersgd", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for name, state, hook in hooks(world):
        if (name == "powersgd") != args.powersgd:
            continue
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
        # small buckets: several per step (their callbacks run concurrently), but one for
        # PowerSGD: its callbacks block in all-reduces of their own; with two buckets, real Gloo
        # races (both worker threads blocked so: a hang; seen too: other losses by step 4)
        ddp = DDP(model, bucket_cap_mb=0.001 if args.powersgd else 0.0002)
        calls = []
        try:
            ddp.register_comm_hook(state, hook if args.powersgd else counted(hook, calls))
        except TypeError as e:  # bf16 wants CUDA and NCCL
            print(f"[{name} rank{rank}] refused: {e}", flush=True)
            continue
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        losses = []
        for _ in range(4):
            x, y = torch.randn(5, 12, generator=g), torch.randn(5, 3, generator=g)
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(f"{loss.item():.8f}")
        if not args.powersgd:
            print(f"[{name} rank{rank}] buckets per step {len(set(calls))} hook calls {len(calls)}", flush=True)
        digest = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        print(f"[{name} rank{rank}] losses {' '.join(losses)} params {digest.sum().item():.8f} "
              f"{digest.abs().sum().item():.8f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
