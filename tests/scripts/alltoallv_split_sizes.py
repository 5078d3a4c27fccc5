"""all_to_all_single given split sizes, even ones on one rank: ProcessGroupGloo runs Gloo's
alltoallv whenever split sizes are given (alltoall only when none are; the two share their
slot prefix, so either would pair), so rank 1's even splits pair with rank 0's uneven ones. Rank 0 sends rank 1 three elements where rank 1
expects two: the longer message aborts rank 1 (SIGABRT in Gloo's I/O thread), as in
alltoall; rank 0 got its two elements from rank 1 and fails in the next all_reduce with
rank 1 gone. The simulator took even splits for alltoall, in its model a different slot, and reported
a hang until both timeouts. Found probing bench/script_sweep.py's `all_to_all_uneven`.
2 ranks."""

import datetime
import os

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2 + rank))
    dist.barrier()
    send, recv = ([1, 3], [1, 2]) if rank == 0 else ([2, 2], [2, 2])
    x = torch.arange(sum(send), dtype=torch.float32) + 10 * rank
    y = torch.zeros(sum(recv))
    dist.all_to_all_single(y, x, recv, send)
    print(f"[{rank}] {y.tolist()}", flush=True)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"[{rank}] after {t.tolist()}", flush=True)


if __name__ == "__main__":
    main()
