"""Distributed testing as mmcv/mmdetection collect it: each rank runs inference over its
DistributedSampler shard (padded with repeated samples), then the parts are collected on
rank 0, which interleaves them back into data set order and cuts the padding off.

--mode cpu: rank 0 makes a temporary directory and broadcasts its name as a 512-byte uint8
tensor padded with spaces; each rank pickles its part there, a barrier, rank 0 reads them.
--mode gpu: each part pickled into a uint8 tensor, the sizes all_gathered, every part padded
to the longest and all_gathered.

    torchrun --nproc-per-node 3 examples/collect_results_tmpdir.py --mode cpu
    simdist compare examples/collect_results_tmpdir.py --nproc-per-node 3 -- --mode gpu
"""

import argparse
import os
import pickle
import shutil
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def collect_results_cpu(part, size, rank, world):
    dir_tensor = torch.full((512,), 32, dtype=torch.uint8)
    if rank == 0:
        tmpdir = tempfile.mkdtemp(dir=".")
        encoded = torch.tensor(bytearray(tmpdir.encode()), dtype=torch.uint8)
        dir_tensor[: len(encoded)] = encoded
    dist.broadcast(dir_tensor, 0)
    tmpdir = dir_tensor.numpy().tobytes().decode().rstrip()
    with open(os.path.join(tmpdir, f"part_{rank}.pkl"), "wb") as f:
        pickle.dump(part, f)
    dist.barrier()
    if rank != 0:
        return None
    parts = []
    for i in range(world):
        with open(os.path.join(tmpdir, f"part_{i}.pkl"), "rb") as f:
            parts.append(pickle.load(f))
    shutil.rmtree(tmpdir)
    return [r for group in zip(*parts) for r in group][:size]


def collect_results_gpu(part, size, rank, world):
    part_tensor = torch.tensor(bytearray(pickle.dumps(part)), dtype=torch.uint8)
    shape = torch.tensor(part_tensor.shape)
    shapes = [shape.clone() for _ in range(world)]
    dist.all_gather(shapes, shape)
    longest = int(torch.tensor(shapes).max())
    send = torch.zeros(longest, dtype=torch.uint8)
    send[: shape[0]] = part_tensor
    recv = [send.new_zeros(longest) for _ in range(world)]
    dist.all_gather(recv, send)
    if rank != 0:
        return None
    parts = [pickle.loads(r[: int(s[0])].numpy().tobytes()) for r, s in zip(recv, shapes)]
    return [r for group in zip(*parts) for r in group][:size]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--n", type=int, default=11)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).eval()
    x = torch.randn(args.n, 4, generator=torch.Generator().manual_seed(1))
    ds = TensorDataset(torch.arange(args.n), x)
    loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, shuffle=False))
    part = []
    with torch.no_grad():
        for idx, xb in loader:
            for i, p in zip(idx.tolist(), model(xb).argmax(1).tolist()):
                part.append({"index": i, "label": p})
    print(f"rank {rank}: {len(part)} results", flush=True)
    collect = collect_results_cpu if args.mode == "cpu" else collect_results_gpu
    results = collect(part, len(ds), rank, world)
    if rank == 0:
        order = [r["index"] for r in results]
        print(f"collected {len(results)} in order: {order == list(range(args.n))}", flush=True)
        print("labels", "".join(str(r["label"]) for r in results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
