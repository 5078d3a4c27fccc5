"""Device moves inside a `torch.compile`d function, as a script written for either machine
has them: `device = "cuda" if torch.cuda.is_available() else "cpu"`, then a compiled step
that moves its host inputs to `device` (`.to(device)` with a device object, `.to("cuda")`-
style strings through `device_name`, `.cuda()` when there is a GPU, a factory's `device=`),
computes, and comes back to the host with `.cpu()`. Each rank runs the step, all-reduces the
result, and prints the values, how dynamo compiled it (graphs, graph breaks: on a GPU and on
the CPU both compile it whole) and where the results live compared with `device` (so that the
lines are the same on either machine). Started torchrun-style; `--backend` is torch.compile's
(inductor, its default)."""

import argparse
import os

import torch
import torch._dynamo
import torch.distributed as dist

gpu = torch.cuda.is_available()
device_name = "cuda" if gpu else "cpu"
device = torch.device(device_name)


def step(w, x, scale):
    x = x.to(device)  # a device object
    w = w.to(device_name, non_blocking=True)  # a string
    s = scale.cuda() if gpu else scale  # `.cuda()` on a GPU machine only, as scripts guard it
    bias = torch.ones(3, device=device)  # a factory
    shift = torch.arange(3, device=device_name, dtype=torch.float32)
    y = (x @ w + bias + shift) * s.to(device)
    host = y.sum(dim=0).cpu()  # back to the host
    return y, host


def summary(y):
    """A compiled function of a tensor already on `device`: one result stays there, one comes
    back to the host (on a GPU a graph of GPU inputs may still return host memory), one is
    moved to the device read off `y` (in a graph that reads the CPU of dynamo's fake tensors)."""
    return y * 2, y.sum().cpu(), (y + 1).to(y.device)


def mixed(y, x):
    """A compiled function of a device tensor `y` and a host `x` whose results a GPU puts on
    either side: host memory computed on after `.cpu()`, a factory given no device, a factory
    sized by `y`, one placed on "cpu" (all host memory on a GPU though `y` is on the device),
    `x.to(y)` and `x.to(y.device)` (on `y`'s device). The move `y * 3` makes the graph one with
    a move on every machine."""
    return (y.to(device) * 3, y.to("cpu", non_blocking=True) + 1, torch.ones(2) + 0,
            torch.zeros(y.size(0)), x.to(y), torch.zeros(2, device="cpu"), x.to(y.device))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager", "uncompiled"])
    p.add_argument("--fullgraph", action="store_true")
    args = p.parse_args()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if gpu:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if gpu else "gloo")
    torch._dynamo.utils.counters.clear()
    fn, sm, mx = step, summary, mixed
    if args.backend != "uncompiled":
        fn, sm, mx = (torch.compile(f, backend=args.backend, fullgraph=args.fullgraph)
                      for f in (step, summary, mixed))
    g = torch.Generator().manual_seed(rank)
    w = torch.randn(4, 3, generator=g)
    for i in range(2):
        x = torch.randn(2, 4, generator=g)
        y, host = fn(w, x, torch.tensor(float(i + 1)))
        total = y.clone()
        dist.all_reduce(total)
        print(f"[rank{rank}] step {i}: y {[round(v, 4) for v in y.flatten().tolist()]} "
              f"host {[round(v, 4) for v in host.tolist()]} total {[round(v, 4) for v in total.flatten().tolist()]}",
              flush=True)
        double, back, same = sm(total)
        print(f"[rank{rank}] step {i}: y on device {y.device.type == device.type}, host on cpu "
              f"{host.device.type == 'cpu'}, total on device {total.device.type == device.type}, summary "
              f"{back.item():.4f} on device {double.device.type == device.type} and on cpu {back.device.type == 'cpu'}, "
              f"moved to y.device on device {same.device.type == device.type}",
              flush=True)
    on = [t.device.type == device.type for t in mx(total, x.double())]
    on_cpu = [t.device.type == "cpu" for t in mx(total, x.double())]
    print(f"[rank{rank}] mixed: tripled on device {on[0]}, after .cpu() on cpu {on_cpu[1]}, a factory of no "
          f"device on cpu {on_cpu[2]}, sized by y on cpu {on_cpu[3]}, placed on \"cpu\" on cpu {on_cpu[5]}, "
          f"x.to(y) on device {on[4]}, x.to(y.device) on device {on[6]}", flush=True)
    counters = torch._dynamo.utils.counters
    breaks = sum(counters["graph_break"].values())
    print(f"[rank{rank}] compiled: frames {counters['stats'].get('unique_graphs', 0)}, graph breaks {breaks}",
          flush=True)
    for reason in sorted(counters["graph_break"]):
        print(f"[rank{rank}] graph break: {reason.splitlines()[0][:160]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
