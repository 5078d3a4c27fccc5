"""Eval metrics whose keys differ per rank (the last rank logs one more), with
TORCH_DISTRIBUTED_DEBUG=DETAIL set by the script before it imports torch, as people do to
find such a bug. On Gloo every rank raises "Detected mismatch between collectives on ranks"
at the metrics' all_reduce (c10d's ProcessGroupWrapper compares the ops' fingerprints); the
simulator does not model that wrapper and names it. Started torchrun-style, world size >= 2."""

import os

os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "DETAIL")

import torch  # noqa: E402 - after the debug level, which torch.distributed reads at import
import torch.distributed as dist  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(4.0)
    dist.all_reduce(x)
    print(f"rank {rank}: warm-up {x.tolist()}", flush=True)
    metrics = {"loss": 0.5 + rank, "acc": 0.9}
    if rank == world - 1:
        metrics["f1"] = 0.7
    t = torch.tensor(list(metrics.values()))
    dist.all_reduce(t)
    print(f"rank {rank}: metrics {t.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
