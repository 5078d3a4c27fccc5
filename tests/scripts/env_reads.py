"""What torch read from the environment when it was imported: c10d's debug level
(TORCH_DISTRIBUTED_DEBUG) and the intra-op thread count (OMP_NUM_THREADS), printed by each
rank after a collective. A rank forked from a fork server must print what a launched one
does. Started torchrun-style, any world size."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"[rank{dist.get_rank()}] debug {dist.get_debug_level()}, threads {torch.get_num_threads()}, "
      f"sum {t.item()}", flush=True)
dist.destroy_process_group()
