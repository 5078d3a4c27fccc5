"""Two sizes of all_gather around Gloo's ring (4 ranks): ranks 0 and 2 gather 2 float64 (16
bytes each), ranks 1 and 3 gather 300 int32 (1200 bytes). Each rank sends its block to the
next rank and receives from the previous one, so rank 3's block lands in rank 0's 16-byte
receive and rank 1's in rank 2's: both receivers abort (SIGABRT), whoever posts last, and
ranks 1 and 3 lose their peers. Found by bench/script_sweep.py (seed 8, case 15): the
simulator failed the last poster at once because a member had aborted, instead of letting
its own messages decide (the receive from a live peer is what kills it)."""

import datetime

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))  # a safety net: nothing waits for it
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank % 2 == 0:
        out = torch.zeros(world * 2, dtype=torch.float64)
        dist.all_gather_into_tensor(out, torch.full((2,), float(rank), dtype=torch.float64))
    else:
        outs = [torch.zeros(300, dtype=torch.int32) for _ in range(world)]
        dist.all_gather(outs, torch.full((300,), rank, dtype=torch.int32))
    print(f"[{rank}] gathered", flush=True)


if __name__ == "__main__":
    main()
