"""The tutorials' shape (the script sets MASTER_ADDR/MASTER_PORT and starts its ranks with
`mp.spawn`; env:// without torchrun's agent, so rank 0's init hosts the store at MASTER_PORT),
with a client of its own of that port made after init, as under torchrun: it reaches the
store rank 0 hosts, its raw keys beside torch's (`default_pg/0//...`).

    python own_store_spawn.py NPROC
"""
import datetime
import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

PORT = 29512  # the script's own choice, as the tutorials' 12355


def main(rank, world):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    own = dist.TCPStore("127.0.0.1", PORT, world, is_master=False, timeout=datetime.timedelta(seconds=20))
    if rank == 0:
        own.set("note", "rank 0's")
    dist.barrier()
    print(rank, "got", own.get("note"), own.port, own.check([f"default_pg/0//cpu//0/{world - 1}"]), flush=True)
    dist.barrier()
    if rank == 0:
        print(rank, "num_keys", own.num_keys(), flush=True)
    dist.barrier()  # rank 0 serves until every client is done
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(int(sys.argv[1]),), nprocs=int(sys.argv[1]))
