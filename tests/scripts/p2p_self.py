"""A rank that sends to or receives from itself. torch's blocking `send` refuses it in
Python (ValueError); `isend`, `irecv` and `recv` reach Gloo, whose pair with the rank itself
was never connected: the call raises at once ("[enforce fail at ...pair.cc] state_ >=
CONNECTED ... Pair is not connected"), and the group still pairs after. Each attempt prints
the exception's type and the first words of its message (the rest names addresses); the
last `recv` is left uncaught, so every rank ends with Gloo's error. Started torchrun-style,
any world size >= 2."""

import torch
import torch.distributed as dist


def attempt(name, fn):
    try:
        fn()
        outcome = "ok"
    except (RuntimeError, ValueError) as e:
        outcome = f"{type(e).__name__}: {' '.join(str(e).split()[:3])}"
    print(f"{name}: {outcome}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt("send", lambda: dist.send(torch.ones(2), dst=rank))
    attempt("isend", lambda: dist.isend(torch.ones(2), dst=rank).wait())
    attempt("irecv", lambda: dist.irecv(torch.zeros(2), src=rank).wait())
    attempt("batch_isend_irecv", lambda: [w.wait() for w in dist.batch_isend_irecv(
        [dist.P2POp(dist.irecv, torch.zeros(2), rank)])])
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the group still pairs
    print(f"sum after: {t.tolist()}", flush=True)
    dist.recv(torch.zeros(1), src=rank)


if __name__ == "__main__":
    main()
