"""Fuzz campaigns on a Dask cluster: the same shards as ``--jobs``, on many machines.

Needs the optional extra: ``pip install 'simdist[cluster]'`` (Dask's `distributed`) here and
on every worker, with the same simdist version. Point it at a running scheduler
(``dask scheduler`` on one machine, ``dask worker tcp://HOST:8786`` on each of the others)
or let it start a local cluster (`DaskExecutor(None, workers=N)`: N worker processes on
this machine, listening on 127.0.0.1 only).

A shard is a plain function call (`simdist.fuzz.search.run_shard`) on picklable data, so a
Dask future per shard is all it takes: the scheduler spreads them over the workers, the
campaign (`simdist.fuzz.campaign.run_campaign`) reads their results in shard order, exactly
as it does for local processes, so a cluster run finds what a local run of the same seed
finds. Differences from local processes: a failure class is written when its shard ends
(not the moment a worker sees it), and Ctrl-C keeps the shards that had ended (running
tasks cannot be stopped from outside; their results are dropped).
"""

from __future__ import annotations

import logging
import threading
import time
import warnings

from distributed import Client, Future, LocalCluster

from simdist.errors import InputError
from simdist.fuzz.campaign import ShardFound
from simdist.fuzz.search import ShardResult, ShardSpec, run_shard
from simdist.fuzz.template import Template

CONNECT_TIMEOUT_S = 30


class DaskExecutor:
    """Runs a campaign's shards as Dask futures (`simdist.fuzz.campaign.Executor`).

    `address`: a scheduler such as ``tcp://10.0.0.5:8786``; None starts a local cluster of
    `workers` processes (one thread each: a shard is pure Python and holds the GIL)."""

    def __init__(self, address: str | None = None, workers: int = 2, connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.cluster: LocalCluster | None = None
        self.client: Client | None = None
        self._futures: dict[Future, int] = {}
        try:
            if address is None:
                with warnings.catch_warnings():  # "port 8787 is in use, using another": its own choice, not news
                    warnings.simplefilter("ignore", UserWarning)
                    self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR)
                self.client = Client(self.cluster)
            else:
                self.client = Client(address, timeout=connect_timeout_s)
        except (OSError, TimeoutError, ValueError) as e:
            self.close()
            where = address or "a local cluster"
            raise InputError(f"--cluster: cannot connect to {where} ({type(e).__name__}: {e})") from None

    @property
    def jobs(self) -> int:
        return self.workers

    @property
    def workers(self) -> int:
        assert self.client is not None
        return len(self.client.scheduler_info().get("workers", {}))

    def submit(self, template: Template, specs: list[ShardSpec], on_found: ShardFound | None,
               stop: threading.Event) -> None:
        # earlier shards first (Dask runs higher priorities first): the campaign reads in order
        assert self.client is not None
        self._futures = {self.client.submit(run_shard, template, s, pure=False, priority=-s.index): s.index
                         for s in specs}

    def results(self, timeout: float) -> list[ShardResult]:
        deadline = time.monotonic() + timeout
        while True:
            done = [f for f in self._futures if f.done()]
            if done or not self._futures or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        out = []
        for f in done:
            self._futures.pop(f)
            if f.status == "finished":
                out.append(f.result())
            elif f.status == "error":
                f.result()  # raises the shard's own exception (a bug, or a bad template) here
        return out

    def busy(self) -> bool:
        return any(not f.done() for f in self._futures)

    def cancel_after(self, index: int) -> None:
        later = [f for f, i in self._futures.items() if i > index]
        if later and self.client is not None:
            self.client.cancel(later)
            for f in later:
                self._futures.pop(f)

    def interrupt(self) -> None:
        if self._futures and self.client is not None:
            self.client.cancel(list(self._futures))
            self._futures = {}

    def close(self) -> None:
        self.interrupt()
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
