"""GPU tensors through pickling keep their device, as on a GPU: `dist.all_gather_object` and
`broadcast_object_list` (torch's `_tensor_to_object` unpickles with no `map_location`, so a
tensor comes back on the GPU it was pickled from), `torch.save`/`torch.load` without
`map_location` (and with `map_location="cpu"`: host memory), plain `pickle`, and a `.cpu()`
copy, which stays on the host. Each rank prints what it got. Started torchrun-style."""

import io
import os
import pickle

import torch
import torch.distributed as dist


def show(rank, key, value):
    print(f"[rank{rank}] {key}: {value}", flush=True)


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    on_gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(local_rank)
    t = torch.tensor([float(rank)], device=device)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"t": t, "host": t.cpu()})
    show(rank, "all_gather_object", [(repr(g["t"]), repr(g["host"])) for g in gathered])
    objs = [{"w": t + 10}] if rank == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    show(rank, "broadcast_object_list", repr(objs[0]["w"]))
    buf = io.BytesIO()
    torch.save({"t": t, "view": t[:1]}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    show(rank, "torch_load", (repr(loaded["t"]), repr(loaded["view"])))
    buf.seek(0)
    show(rank, "torch_load_cpu", repr(torch.load(buf, map_location="cpu")["t"]))
    copied = pickle.loads(pickle.dumps(t * 2))
    show(rank, "pickle", repr(copied))
    try:
        show(rank, "numpy", copied.numpy().tolist())
    except TypeError as e:
        show(rank, "numpy", f"TypeError: {e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
