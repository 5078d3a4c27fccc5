"""Per-rank caps on how many batches a `torch.utils.data.DataLoader` yields (`--batches 5,6`).

"What if rank 3 gets fewer batches?" needs no change to the script: with
`SIMDIST_SCRIPT_BATCHES` set ("5,6": one cap per rank; "5": the same cap for every rank),
every DataLoader of rank r behaves as if it held at most cap[r] batches:

* **each iteration is capped**: an epoch (`iter(loader)`, a `for` loop over it) yields at
  most cap[r] batches, then stops as an exhausted loader does (a non-persistent worker pool
  is shut down at that point, as torch does at exhaustion; persistent workers are reset by
  torch at the next epoch). Every epoch and every loader is capped on its own, so a
  training loader and an evaluation loader both yield at most cap[r] batches per epoch;
* **`len(loader)` agrees**: min(its length, cap[r]), so code that counts on it (the last
  step of an accumulation, a scheduler's steps per epoch) sees the shorter loader it would
  see with genuinely fewer batches.

The cap lives in the iterator that the rank's main process reads (`_BaseDataLoaderIter`,
which both the single- and the multi-process iterator inherit `__next__` from), so it holds
with `num_workers > 0` too: workers may prefetch, but only cap[r] batches come out. The same
layer runs on real Gloo ranks (the "gloo" mode), so both sides honour a cap identically.

A loader iterated before its process knows its rank (no RANK in the environment and no
`init_process_group` yet) is not capped; a warning says so once.

Each batch yielded is also counted and reported to the coordinator (the report's
`inputs_processed`; how long an uncapped epoch runs and whether a cap ended one tell the
fuzzer which caps mean something).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

from simdist.script import env
from simdist.script.rank import client

_caps: list[int] = []
_state = {"yielded": 0, "longest": 0, "capped": 0, "warned": False}


def _rank() -> int | None:
    c = client.CLIENT
    if c is not None and c.rank is not None:
        return c.rank
    r = os.environ.get("RANK", "")
    return int(r) if r.isdigit() else None


def cap() -> int | None:
    """This rank's cap, or None when there is none (no caps, or the rank is not known yet)."""
    if not _caps:
        return None
    if len(_caps) == 1:
        return _caps[0]
    rank = _rank()
    if rank is None:
        if not _state["warned"]:
            _state["warned"] = True
            sys.stderr.write("simdist: a DataLoader was iterated before this process knew its rank; it is not "
                             "capped by --batches\n")
        return None
    return _caps[rank] if rank < len(_caps) else None


def _send() -> None:
    """Tell the coordinator the rank's batch counts so far (once it is a rank)."""
    c = client.CLIENT
    if c is not None and c.rank is not None:
        c.send({"t": "batches", "n": _state["yielded"], "longest": _state["longest"], "capped": _state["capped"],
                "cpu": time.thread_time()})  # (stamped on the rank's clock: `RankConn.batches_after`)


def _has_more(it: Any, orig_len: Any) -> bool:
    """Whether the loader would have yielded another batch (an IterableDataset without a
    length: assume so)."""
    try:
        return it._num_yielded < orig_len(it)
    except TypeError:
        return True


def configure() -> None:
    """Read the caps from the environment (at install; again in a rank forked by the zygote)."""
    text = os.environ.get(env.BATCHES, "")
    _caps[:] = env.parse_batches(text) if text else []
    _state.update(yielded=0, longest=0, capped=0, warned=False)


def install() -> None:
    """Patch the DataLoader and its iterators (called once torch is imported)."""
    configure()
    from torch.utils.data import dataloader as dl

    base = dl._BaseDataLoaderIter
    orig_next, orig_iter_len, orig_len = base.__next__, base.__len__, dl.DataLoader.__len__

    @functools.wraps(orig_next)
    def __next__(self: Any) -> Any:
        limit = cap()
        if limit is not None and self._num_yielded >= limit:
            if _has_more(self, orig_iter_len):
                _state["capped"] += 1
                _send()
            if not self._persistent_workers and hasattr(self, "_shutdown_workers"):
                self._shutdown_workers()  # as torch does when a loader runs out
            raise StopIteration
        data = orig_next(self)
        _state["yielded"] += 1
        _state["longest"] = max(_state["longest"], self._num_yielded)
        _send()
        return data

    @functools.wraps(orig_iter_len)
    def iter_len(self: Any) -> int:
        return _capped_len(orig_iter_len(self))

    @functools.wraps(orig_len)
    def loader_len(self: Any) -> int:
        return _capped_len(orig_len(self))

    base.__next__ = __next__  # type: ignore[method-assign]
    base.__len__ = iter_len  # type: ignore[method-assign]
    dl.DataLoader.__len__ = loader_len  # type: ignore[method-assign]


def _capped_len(n: int) -> int:
    limit = cap()
    return n if limit is None else min(n, limit)
