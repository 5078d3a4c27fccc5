"""ReduceOp.AVG on integer and bool tensors, which ProcessGroupGloo cannot divide: every
form of reduction prints what it raised (and when: issue, wait() or the future) and what
its tensors hold afterwards; later collectives still pair; the last AVG is left uncaught,
so each rank ends with Gloo's error. Started torchrun-style, any world size >= 2."""

import torch
import torch.distributed as dist

AVG = dist.ReduceOp.AVG


def attempt(name, fn, *shown):
    try:
        fn()
        outcome = "ok"
    except RuntimeError as e:
        outcome = f"RuntimeError: {e}"
    print(f"{name}: {outcome} -> {[t.tolist() for t in shown]}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def ints(n, dtype=torch.int64):
        return (torch.arange(n) * (rank + 2) + 3 * rank + 1).to(dtype)

    for dtype in (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool):
        t = ints(5, dtype)
        attempt(f"all_reduce {dtype}", lambda t=t: dist.all_reduce(t, op=AVG), t)
    t = ints(3, torch.float16)
    attempt("all_reduce float16", lambda: dist.all_reduce(t, op=AVG), t)

    t = ints(6)
    work = dist.all_reduce(t, op=AVG, async_op=True)
    # (not printed before wait(): whether real Gloo has finished by then is a race)
    attempt("async wait", work.wait, t)
    print(f"after wait: completed {work.is_completed()}")
    t = ints(4)
    fut = dist.all_reduce(t, op=AVG, async_op=True).get_future()
    try:
        fut.wait()
        print("async future: ok")
    except RuntimeError as e:
        # the simulated future fails through a Python callback, which torch's message prefixes
        # ("Got the following error when running the callback: ..."; docs/script-backend.md)
        gloo = "result type Float can't be cast to the desired output type Long"
        print(f"async future: RuntimeError naming Gloo's error: {gloo in str(e)} -> {t.tolist()}")

    t = ints(2 * world + 1)
    attempt("reduce", lambda: dist.reduce(t, dst=world - 1, op=AVG), t)
    inp, out = ints(2 * world), torch.zeros(2, dtype=torch.int64)
    attempt("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(out, inp, op=AVG), out, inp)
    ins, out = [ints(2) + 10 * k for k in range(world)], torch.zeros(2, dtype=torch.int64)
    # (its output is not shown: Gloo runs it as one all_reduce per input and the first
    # failing wait raises, so whether the rank's own part has landed yet is a race)
    attempt("reduce_scatter list", lambda: dist.reduce_scatter(out, ins, op=AVG), *ins)
    ts = [ints(2), ints(3)]
    attempt("all_reduce_coalesced", lambda: dist.all_reduce_coalesced(ts, op=AVG), *ts)

    t = torch.tensor([rank + 1])
    dist.all_reduce(t)
    print(f"then a SUM pairs as usual: {t.tolist()}")
    dist.all_reduce(ints(3), op=AVG)


if __name__ == "__main__":
    main()
