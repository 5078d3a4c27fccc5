"""An mp.spawn worker killed by a signal while its peers wait on it in a collective: after one
all_reduce together, rank 1 kills itself (SIGKILL, or SIGSEGV as a crash in native code
would) while the others are in their second all_reduce. mp.spawn's parent sees the signal's
exit and SIGTERMs the others at once, while their Gloo threads read rank 1's closed
connections: a peer either is killed or loses rank 1 first (the spawn race,
`simdist.spawn_race`), on real Gloo as in the simulator.

    python selfkill_spawn.py [SIGNAL [WORLD]]
"""
import os
import signal
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, signame, path):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    t = torch.ones(2)
    dist.all_reduce(t)
    print(rank, "first", t.tolist(), flush=True)
    if rank == 1:
        os.kill(os.getpid(), getattr(signal, signame))
    dist.all_reduce(t)
    print(rank, "second", t.tolist(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "SIGKILL"
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    fd, rendezvous = tempfile.mkstemp()
    os.close(fd)
    os.remove(rendezvous)
    try:
        mp.spawn(worker, args=(size, name, rendezvous), nprocs=size)
    finally:
        if os.path.exists(rendezvous):
            os.remove(rendezvous)
