"""A script run as-is that calls init_process_group as torchrun would have it (env://, no
rank or world size given) without torchrun's environment: torch's rendezvous raises there.

    python init_without_env.py [RANK]   (RANK given: the world size is what is missing)
"""
import os
import sys

import torch.distributed as dist

for var in ("RANK", "WORLD_SIZE"):
    os.environ.pop(var, None)
if len(sys.argv) > 1:
    os.environ["RANK"] = sys.argv[1]
dist.init_process_group("gloo")
