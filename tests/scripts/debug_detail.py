"""TORCH_DISTRIBUTED_DEBUG=DETAIL set by the script before it imports torch, as people do to
find a collective bug: on Gloo torch wraps each group in c10d's ProcessGroupWrapper, which
checks every collective's fingerprint across ranks first (`simdist.script.rank.pgwrapper`).
Started torchrun-style, world size >= 2. `--case`:

* ok: a correct loop (all_reduce, broadcast, scatter, barrier): completes, with the wrapper's
  all_gathers in each rank's Flight Recorder;
* shape: eval metrics whose keys differ per rank (the last rank logs one more): an all_reduce
  of 2 values against 3, "Detected mismatch between collectives on ranks" on every rank;
* op: the last rank broadcasts where the others all-reduce;
* skip: uneven inputs without Join (rank 0 has one batch more), then every rank all-reduces
  its loss: rank 0's extra batch meets the others' loss all_reduce at the same sequence number,
  caught by its shape (a loss of the gradient's shape would pass the check and mix them);
* skip_exit: the same with nothing after the loop: the others leave, rank 0's extra batch
  finds them gone in the wrapper's monitored barrier;
* ddp: DistributedDataParallel's constructor (torch 2.13 dies there by SIGSEGV under DETAIL);
* p2p: rank 0 sends to rank 1, then every rank all-reduces: a send counts in Gloo's sequence
  number, so with 3 ranks the third is one behind ("Sequence number: 1vs 2"); with 2 it passes;
* stuck: the last rank waits in a recv that rank 0 never sends while the others all-reduce:
  they wait in the wrapper's monitored barrier for it (a hang; with --timeout, the barrier's
  error naming it);
* ndim: rank 0 all-reduces a 14-dim tensor (a fingerprint of 20 values), the others a 1-D
  one: they read its length as an op type, which none is (torch's internal assert);
* keys: the default store's key count after a subgroup is made (each group's helper Gloo group
  adds its members' rendezvous keys).
"""

import argparse
import os
from datetime import timedelta

os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "DETAIL")

import torch  # noqa: E402 - after the debug level, which torch.distributed reads at import
import torch.distributed as dist  # noqa: E402


def ok(rank: int, world: int) -> None:
    for step in range(2):
        x = torch.arange(4.0) + rank
        dist.all_reduce(x)
        w = torch.full((2, 3), float(rank))
        dist.broadcast(w, src=world - 1)
        part = torch.zeros(2)  # a scatter's size in FR is its output's times the group's, unknown there
        dist.scatter(part, [torch.full((2,), float(i)) for i in range(world)] if rank == 0 else None, src=0)
        print(f"rank {rank}: step {step} {x.tolist()} {w[0].tolist()} {part.tolist()}", flush=True)
    dist.barrier()


def shape(rank: int, world: int) -> None:
    metrics = {"loss": 0.5 + rank, "acc": 0.9}
    if rank == world - 1:
        metrics["f1"] = 0.7
    t = torch.tensor(list(metrics.values()))
    dist.all_reduce(t)
    print(f"rank {rank}: metrics {t.tolist()}", flush=True)


def op(rank: int, world: int) -> None:
    t = torch.ones(2)
    if rank == world - 1:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
    print(f"rank {rank}: {t.tolist()}", flush=True)


def skip(rank: int, world: int, final: bool = True) -> None:
    batches = 3 if rank == 0 else 2
    for b in range(batches):
        grad = torch.ones(4) * b
        dist.all_reduce(grad)
        print(f"rank {rank}: batch {b}", flush=True)
    if final:
        loss = torch.tensor([float(rank)])
        dist.all_reduce(loss)
        print(f"rank {rank}: loss {loss.item()}", flush=True)


def ddp(rank: int, world: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(rank)
    print(f"rank {rank}: wrapping", flush=True)
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    print(f"rank {rank}: stepped", flush=True)


def p2p(rank: int, world: int) -> None:
    t = torch.ones(2)
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
    dist.all_reduce(t)
    print(f"rank {rank}: {t.tolist()}", flush=True)


def keys(rank: int, world: int) -> None:
    sub = dist.new_group(list(range(world - 1)))
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    print(f"rank {rank}: {store.num_keys()} keys", flush=True)
    dist.barrier()
    dist.destroy_process_group(sub)


def stuck(rank: int, world: int) -> None:
    t = torch.ones(2)
    if rank == world - 1:
        dist.recv(t, 0)  # rank 0 never sends
    else:
        dist.all_reduce(t)  # the wrapper's barrier waits for the last rank
    print(f"rank {rank}: {t.tolist()}", flush=True)


def ndim(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones((1,) * 14) if rank == 0 else torch.ones(2))


CASES = {"ndim": ndim, "stuck": stuck, "ok": ok, "shape": shape, "op": op, "skip": skip, "ddp": ddp, "p2p": p2p, "keys": keys}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="shape", choices=[*CASES, "skip_exit"])
    parser.add_argument("--timeout", type=float, default=0.0, help="the group's timeout (s); 0: torch's default")
    case = parser.parse_args().case
    timeout = parser.parse_args().timeout
    dist.init_process_group("gloo", **({"timeout": timedelta(seconds=timeout)} if timeout else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(4.0)
    dist.all_reduce(x)
    print(f"rank {rank}: warm-up {x.tolist()}", flush=True)
    if case == "skip_exit":
        skip(rank, world, final=False)
    else:
        CASES[case](rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
