"""ReduceOp.PREMUL_SUM (NCCL's pre-multiplied sum, made by `dist._make_nccl_premul_sum` as
FSDP does) handed to Gloo: ProcessGroupGloo takes the work and fails it at wait() ("Cannot
use ReduceOp.PREMUL_SUM with Gloo") without touching the tensor or the wire, so the next
collectives still pair. Every form prints what it raised and what the tensor holds after;
the last one is left uncaught, so each rank ends with Gloo's error. Found by
bench/script_sweep.py's `gloo_refuses` family (the simulator refused it as unsupported).
Started torchrun-style, any world size >= 2."""

import torch
import torch.distributed as dist


def attempt(name, fn, t):
    try:
        fn()
        outcome = "ok"
    except RuntimeError as e:
        outcome = f"RuntimeError: {e}"
    print(f"{name}: {outcome} -> {t.tolist()}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    premul = dist._make_nccl_premul_sum(2.0)
    t = torch.arange(3.0) + rank
    attempt("all_reduce", lambda: dist.all_reduce(t, op=premul), t)
    t = torch.arange(3.0) + rank
    attempt("all_reduce async", lambda: dist.all_reduce(t, op=premul, async_op=True).wait(), t)
    t = torch.arange(3.0) + rank
    attempt("reduce", lambda: dist.reduce(t, dst=world - 1, op=premul), t)
    out = torch.zeros(2)
    attempt("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(out, torch.ones(2 * world), op=premul), out)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the group still pairs
    print(f"sum after: {t.tolist()}", flush=True)
    dist.all_reduce(torch.ones(1), op=premul)


if __name__ == "__main__":
    main()
