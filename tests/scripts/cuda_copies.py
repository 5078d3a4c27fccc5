"""GPU-style code that relies on a host-to-device copy being a copy: a preloaded dataset
kept on the host, sliced per batch (a view), moved to the GPU and normalised in place there;
a reused host staging buffer; predictions moved back with .cpu() and clipped in place in
NumPy. On a GPU each move is a new tensor and the host data stays as it was; the script
prints what it sees of the original, a permutation drawn with a generator made on the
device, and an all-reduced checksum. Started torchrun-style."""

import os

import torch
import torch.distributed as dist


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(rank)
    data = torch.randn(12, 4, generator=g)  # the whole "dataset", on the host
    before = data.clone()
    total = torch.zeros((), device=device)
    for _epoch in range(2):
        for i in range(0, 12, 4):
            xb = data[i:i + 4].to(device, non_blocking=True)
            xb.sub_(xb.mean(dim=0)).div_(xb.std(dim=0) + 1e-6)  # in-place normalisation on the device
            total += xb.pow(2).sum()
    print(f"[rank{rank}] host data unchanged {torch.equal(data, before)}", flush=True)
    staging = torch.empty(4)
    outs = []
    for step in range(3):
        staging.fill_(float(step + rank))
        outs.append(staging.to(device))
    print(f"[rank{rank}] staged {[o[0].item() for o in outs]} same tensor {outs[0] is staging}", flush=True)
    preds = torch.tensor([-1.0, 2.0, -3.0], device=device)
    arr = preds.cpu().numpy()
    arr[arr < 0] = 0.0
    print(f"[rank{rank}] preds on device after clipping a host copy {preds.tolist()}", flush=True)
    moved_twice = preds.to(device)
    print(f"[rank{rank}] device->device move is a no-op {moved_twice is preds}", flush=True)
    gen = torch.Generator(device=device).manual_seed(1)  # a sampler's generator, on the device
    print(f"[rank{rank}] device generator draws {torch.randperm(5, generator=gen, device=device).tolist()}", flush=True)
    dist.all_reduce(total)
    print(f"[rank{rank}] checksum {total.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
