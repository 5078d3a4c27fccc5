"""Store calls a simulated rank makes before its `init_process_group`: a link of their own.

A script may use a store before (or without) init: a custom launcher's own
`TCPStore(MASTER_ADDR, MASTER_PORT, world_size, is_master=rank == 0)` to exchange a run id or
a port, torch's env:// rendezvous store (`next(dist.rendezvous("env://"))`), rank 0's own
server that waits for its workers (`mp.spawn`). The rank's connection to the coordinator
(`rank.client.CLIENT`) is made by init, and its presence means "initialised" to every patch
of the rank (sleeps told, groups, exits), so these calls go on a connection of their own: one
per process, made at the first such call, one request at a time (a TCPStore client's calls
are serialised on its socket too).

Before a process's first init nothing is simulated (`simdist.script.rendezvous`: the ranks
run the script's code for real, and when each entered init is the model), so the
coordinator answers these calls in the order they come, and a wait's timeout runs on the
wall clock (`keystore.KeyStoreMixin._kv_early`), as a real store's does.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from typing import Any

from simdist.script import env, wire
from simdist.script.rank.client import EXIT_COORDINATOR_GONE

_LOCK = [threading.Lock()]
_LINK: list[socket.socket] = []  # the process's link, once made
_IDS = itertools.count(1)


def request(header: dict[str, Any]) -> dict[str, Any]:
    """Send a store call (`rank.simstore.SimStore._call`'s header) and block for its answer."""
    with _LOCK[0]:
        if not _LINK:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(os.environ[env.SOCKET])
            _LINK.append(sock)
        sock = _LINK[0]
        rid = next(_IDS)
        wire.send(sock, {**header, "req": rid, "early": True, "pid": os.getpid()})
        while True:
            got = wire.recv(sock)
            if got is None:  # the coordinator is gone: the run is over
                os._exit(EXIT_COORDINATOR_GONE)
            if got[0].get("req") == rid:
                return got[0]


def _forget() -> None:
    """In a forked child (a DataLoader worker): the parent's link is not its to use (nor its
    lock, which another thread of the parent may have held at the fork)."""
    _LINK.clear()
    _LOCK[0] = threading.Lock()


os.register_at_fork(after_in_child=_forget)
