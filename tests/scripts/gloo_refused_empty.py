"""Zero-element collectives whose reduce op or dtype Gloo refuses: PREMUL_SUM, a bitwise op on
a float tensor, int16 (no kernel). Gloo picks the reduction function (or the dtype's kernel)
before its algorithm sees the empty tensor, so each work fails at wait() as a non-empty one
does, where an accepted empty all_reduce/reduce/all_gather completes without the wire
(`simdist.vocab.gloo_empty_is_local`). The group still pairs after. Started torchrun-style,
any world size >= 2."""

import torch
import torch.distributed as dist


def attempt(name, fn):
    try:
        fn()
        outcome = "ok"
    except RuntimeError as e:
        outcome = f"RuntimeError: {e}"
    print(f"{name}: {outcome}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    premul = dist._make_nccl_premul_sum(2.0)
    empty, empty16 = torch.zeros(0), torch.zeros(0, dtype=torch.int16)
    attempt("premul all_reduce", lambda: dist.all_reduce(empty, op=premul))
    attempt("premul reduce async", lambda: dist.reduce(empty, dst=world - 1, op=premul, async_op=True).wait())
    attempt("band all_reduce", lambda: dist.all_reduce(empty, op=dist.ReduceOp.BAND))
    attempt("int16 all_gather", lambda: dist.all_gather([torch.zeros(0, dtype=torch.int16)] * world, empty16))
    attempt("sum all_reduce", lambda: dist.all_reduce(empty))  # accepted: no wire
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the group still pairs
    print(f"sum after: {t.tolist()}", flush=True)


if __name__ == "__main__":
    main()
