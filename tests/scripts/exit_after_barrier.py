"""A rank that leaves right after a barrier, while its peers go on to broadcasts it should
have joined (3 ranks, root 2). On Gloo the leaving process takes longer to close its
sockets than the root takes to post, so the root's first send (to the leaver) is accepted
and its second reaches rank 1: rank 1's first broadcast completes, and only the root's
wait (and rank 1's next broadcast, once the root is gone) fails. Found by
bench/script_sweep.py: the simulator compared the leaver's exit time on the engine's clock
with the root's post on the rank's own, and failed the root as it posted."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    if rank == 0:
        print("[0] leaving", flush=True)
        dist.destroy_process_group()
        return
    size = torch.full((1,), 10 * rank, dtype=torch.int64)
    dist.broadcast(size, src=2)
    print(f"[{rank}] first broadcast {size.tolist()}", flush=True)
    data = torch.zeros(4)
    dist.broadcast(data, src=2)
    print(f"[{rank}] second broadcast {data.tolist()}", flush=True)


if __name__ == "__main__":
    main()
