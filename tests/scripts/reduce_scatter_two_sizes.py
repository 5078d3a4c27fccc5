"""reduce_scatter_tensor of two sizes while a third member is elsewhere (3 ranks). Gloo runs it
as an all_reduce of the whole input (ProcessGroupGloo), whose ring sends rank 2's first
segment (12 bytes) to rank 1 before anyone needs rank 0: rank 1 posted a 4-byte receive and
aborts (SIGABRT) at once; rank 0, stuck in a receive from rank 1, fails with the peer gone,
and rank 2, waiting for rank 0's segment, fails when rank 0 leaves. Found by
bench/script_sweep.py: the simulator judged a collective only once every member posted, so
nobody aborted and all waited for the timeout."""

import datetime

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    rank = dist.get_rank()
    if rank == 0:
        got = torch.zeros(1)
        dist.recv(got, src=1)  # rank 1 never sends
        return
    if rank == 1:
        out, inp = torch.zeros(2), torch.arange(6, dtype=torch.float32)
    else:
        out, inp = torch.zeros(5, dtype=torch.int32), torch.arange(15, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, inp)
    print(f"[{rank}] reduce_scatter {out.tolist()}", flush=True)


if __name__ == "__main__":
    main()
