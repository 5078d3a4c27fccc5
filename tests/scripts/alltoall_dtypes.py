"""all_to_all_single where one rank's tensor has another dtype of the same element size
(float64 beside int64): Gloo's alltoall exchanges raw bytes, so every rank completes and
reads its peers' blocks as its own dtype; a later collective pairs as usual (found by
bench/script_sweep.py: the simulator reported the mismatch as a hang)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float64 if rank == 1 else torch.int64
    inp = torch.arange(2 * world, dtype=dtype) + 100 * rank
    out = torch.zeros_like(inp)
    dist.all_to_all_single(out, inp)
    print(f"[{rank}] all_to_all {dtype}: {out.tolist()}", flush=True)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(f"[{rank}] then all_reduce {t.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
