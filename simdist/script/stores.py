"""Who hosts the c10d store a rank's `init_process_group` meets its world at, and what a rank
waiting there raises when a peer is missing: the rules of `simdist.script.rendezvous`, and
the rank side's reading of which store a script's init makes (`rank.patches`).

torch 2.13 (`torch.distributed.rendezvous._create_c10d_store`) makes one of two stores:

* one that exists before init: torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True,
  torchrun's default), a `store=` argument, a FileStore. A rank's init waits there, in Gloo's
  full-mesh connect, for every peer's address; with `timeout=T` it raises T after it entered
  `DistStoreError: wait timeout after <T ms>ms, keys: /default_pg/0//cpu//0/<r>`, r the
  lowest rank whose address was not there (`store_timeout`);
* one rank 0 hosts (`env://` or `tcp://` without the agent store: the shape of `mp.spawn`
  tutorials, MASTER_ADDR/MASTER_PORT set by the script): rank 0's TCPStore server waits for
  every rank's client before its init posts rank 0's address. Measured on torch 2.13
  (`tests/scripts/spawn_rank_missing.py`, 2 and 3 ranks, T = 0.5 to 5 s):

  - rank 0 raises `DistStoreError: Timed out after <N> seconds waiting for clients.
    <k>/<W> clients joined.` at N = floor(T) + 1 s after it entered (TCPStore counts
    whole seconds and ends once more than T have passed: 1 s for 0.5, 2 s for 1 and 1.5,
    4 s for 3), k counting rank 0 itself and every client that connected (`host_timeout`);
  - a rank that connected waits for rank 0's address, which is not there while rank 0
    waits for clients: `DistStoreError: wait timeout after <T ms>ms, keys:
    /default_pg/0//cpu//0/0` T after it entered, or, if rank 0's server closes first
    (rank 0 timed out), `DistNetworkError: Failed to recv, got 0 bytes. Connection was
    likely closed. Did the remote server shutdown or crash?` then (`SERVER_GONE`);
  - a rank that finds no server (rank 0 never came, came too late, or its server closed)
    retries until `DistNetworkError: The client socket has timed out after <T ms>ms while
    trying to connect to (<MASTER_ADDR>, <MASTER_PORT>).` The retries take a random back-off:
    measured 1.6 to 2.7 s for T = 1 s, 3.3 to 4.9 s for T = 2 s, 8.2 s for T = 4 s; the
    simulator says 2 T (`CONNECT_FACTOR`).

  Under `mp.spawn` the first rank to raise ends the others: spawn SIGTERMs every live
  process once one fails, so a rank whose own deadline is later dies of that signal in its
  init (the simulated ranks run the script's own mp.spawn, which does the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import urlparse

# init's timeout when the script gives none (torch's `_get_default_timeout`: `default_pg_timeout`,
# 30 min, for Gloo; 10 min for NCCL, documented in `init_process_group`); the store's waits
# use it as they use `timeout=` (measured with the default patched to 1 s: the same errors at 1 s)
DEFAULT_TIMEOUT_S = {"gloo": 1800.0, "nccl": 600.0}
STORE_PREFIX = "/default_pg"  # the default group's prefix in the store (env://, tcp://, torchrun)
# TORCH_DIST_INIT_BARRIER=1's barrier at the store (`simdist.script.barriers`): how a wait there is
# named on either side (the real side's stall, `rank.stall`), and torch's key prefix (STORE_BASED_BARRIER_PREFIX)
BARRIER_CALL = "the store-based barrier (TORCH_DIST_INIT_BARRIER=1)"
BARRIER_KEY = "store_based_barrier_key"
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": torchrun's agent hosts the store (its default)
# what torch's C++ logs (after "[E<time> ") for a TCPStore with is_master=True at MASTER_PORT under torchrun
BIND_IGNORED = ("TCPStore.cpp:277] [c10d] The server socket on {} has failed to bind. "
                "TORCHELASTIC_USE_AGENT_STORE is enabled so ignoring the error.")
# a connect to a store nobody serves gives up after about twice its timeout (see above)
CONNECT_FACTOR = 2.0
SERVER_GONE = ("DistNetworkError", "Failed to recv, got 0 bytes. Connection was likely closed. "
               "Did the remote server shutdown or crash?")

Address = tuple[str, int]


def rank0_hosts(init_method: str | None, store_given: bool, environ: Mapping[str, str]) -> Address | None:
    """Where rank 0's init will host the store (MASTER_ADDR/PORT, or the tcp:// URL's), or
    None where the store exists before init (agent store, `store=`, file://). Raises what
    torch's rendezvous raises for an address it cannot read (`store_address`)."""
    if store_given:
        return None
    at = store_address(init_method, environ)
    return None if environ.get(AGENT_STORE) == "True" else at


def store_address(init_method: str | None, environ: Mapping[str, str]) -> Address | None:
    """The store's address as torch 2.13's env:// and tcp:// rendezvous read it
    (`torch.distributed.rendezvous._env_rendezvous_handler`, `_tcp_rendezvous_handler`,
    `_create_c10d_store`'s port check), with the ValueError they raise at init's start when
    it is missing or bad (torchrun's agent store too is reached at MASTER_ADDR/PORT); None
    for another scheme (file://). The rank and world size are read apart (`rank.patches`)."""
    method = init_method or "env://"
    if method.startswith("env://"):
        def read(var: str) -> str:
            if not environ.get(var):
                raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: environment "
                                 f"variable {var} expected, but not set")
            return environ[var]

        addr = read("MASTER_ADDR")
        at = addr, int(read("MASTER_PORT"))  # int()'s own ValueError for a port that is no number, as torch's
    elif method.startswith("tcp://"):
        url = urlparse(method)
        if url.port is None:  # (urllib's own ValueError for a port out of range or no number, as torch's)
            raise ValueError("Error initializing torch.distributed using tcp:// rendezvous: port number missing")
        at = url.hostname or "", url.port
    else:
        return None
    if not 0 <= at[1] < 2**16:
        raise ValueError(f"port must have value from 0 to 65535 but was {at[1]}.")
    return at


def store_timeout(limit_s: float, missing: int) -> tuple[str, str]:
    """What a rank raises when its init's wait at the store for rank `missing`'s address runs out."""
    return "DistStoreError", f"wait timeout after {round(limit_s * 1000)}ms, keys: {STORE_PREFIX}/0//cpu//0/{missing}"


def host_wait_s(limit_s: float) -> float:
    """How long rank 0's store server waits for its clients: whole seconds, until more than T."""
    return float(math.floor(limit_s) + 1)


def host_timeout(limit_s: float, joined: int, world_size: int) -> tuple[str, str]:
    """What rank 0 raises when not every rank's client joined its store in time."""
    return "DistStoreError", (f"Timed out after {int(host_wait_s(limit_s))} seconds waiting for clients. "
                              f"{joined}/{world_size} clients joined.")


def connect_timeout(limit_s: float, at: Address) -> tuple[str, str]:
    """What a rank raises when no store server answered at rank 0's address."""
    return "DistNetworkError", (f"The client socket has timed out after {round(limit_s * 1000)}ms while trying "
                                f"to connect to ({at[0]}, {at[1]}).")
