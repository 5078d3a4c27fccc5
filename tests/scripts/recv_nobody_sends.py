"""A hang on real Gloo that the watchdog ends: rank 0 runs three all_reduces, rank 1 two and
then a recv that nobody sends. Each rank is blocked in a different operation on its own line."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(3 if rank == 0 else 2):
    t = torch.ones(2)
    dist.all_reduce(t)
    print(rank, i, t.tolist(), flush=True)
if rank == 1:
    dist.recv(torch.zeros(1), src=0)
print(rank, "done", flush=True)
dist.destroy_process_group()
