"""The backend torch creates the simulated groups from: its registration and creator.

Kept apart from `pg` (what a group does with each operation) because making a group is a
different exchange with the coordinator: torch calls `create` for WORLD and for each
`new_group`, and for a group of named members it waits, as Gloo's does, until every member
has made it (`Coordinator._group`), carrying the group's timeout where it is shorter than
torch's default (`simdist.script.deadlines`), and as "lto" where it is not: for the group's
operations alone, whose deadline only threads in timed waits carry a stuck run to
(`simdist.script.timedwakes`).
"""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simdist.script import env
from simdist.script.rank import client, simstore, stack
from simdist.script.rank.pg import BACKEND_NAME, SimProcessGroup
from simdist.script.rank.pgwrapper import HELPER_PREFIX, DetailGroup, crash_ddp_logger, helper_name


def create(opts: Any, backend_options: Any = None) -> SimProcessGroup:
    """The backend creator torch calls for WORLD and for each `new_group` (members only)."""
    detail = dist.get_debug_level() == dist.DebugLevel.DETAIL  # torch wraps a Gloo group then (`pgwrapper`)
    given = list(opts.global_ranks_in_group)
    ranks = given or list(range(opts.group_size))
    name = env.group_name(str(opts.group_id), not given, client.CLIENT.generation if client.CLIENT else 1)
    # the group's timeout, where Gloo's would end a stuck run sooner than torch's default
    # (`simdist.script.deadlines`: the default's 30 minutes are reported as the hang at once)
    limit = opts.timeout.total_seconds() if opts.timeout < c10d.default_pg_timeout else None
    # ... and where it is not, for the group's ops alone: threads in timed waits may carry a stuck
    # run there in simulated time (`simdist.script.timedwakes`)
    long = None if limit is not None else opts.timeout.total_seconds()
    if client.CLIENT is not None:
        _post_address(opts, whole=not given)
        if detail:  # the helper Gloo group's rendezvous key, under torch's "pg_wrapper:<name>" prefix
            _post_address(opts, whole=not given, prefix=f"{HELPER_PREFIX}:{opts.group_id}/")
    if client.CLIENT is not None and given:
        # returns once every member has made the group of this name, as Gloo's does
        # (`Coordinator._group`)
        reply = client.CLIENT.request({"t": "group", "g": name, "ranks": ranks, "to": limit, "lto": long,
                                       "unnamed": detail, "key": str(opts.group_id), "frames": stack.caller_stack(1),
                                       "cpu": time.thread_time()},
                                      blocks=True)
        if reply.get("raise"):  # the store's error at the group's timeout (`simdist.script.groups`)
            kind, message = reply["raise"]
            raise getattr(dist, kind, RuntimeError)(message)
    elif client.CLIENT is not None:
        client.CLIENT.send({"t": "group", "g": name, "ranks": ranks, "to": limit, "lto": long, "unnamed": detail})
    if not detail:
        return SimProcessGroup(opts.group_rank, opts.group_size, name, ranks)
    if client.CLIENT is not None:  # made once the group is (every member is past the group's rendezvous)
        client.CLIENT.send({"t": "group", "g": helper_name(name), "ranks": ranks, "to": limit, "lto": long,
                            "unnamed": True})
    crash_ddp_logger()
    return DetailGroup(opts.group_rank, opts.group_size, name, ranks, opts.timeout)


def _post_address(opts: Any, whole: bool, prefix: str = "") -> None:
    """The key Gloo's rendezvous leaves in the store for this rank of the group (its address,
    under the group's and the device's prefixes: `default_pg/0//cpu//0/<group rank>` for WORLD
    under torchrun, measured with `list_keys` on torch 2.13), so a script's `num_keys` and a
    raw client's `list_keys` count what they count on Gloo (`rank.ownstore`). The value is no
    address: nothing connects to a simulated rank.

    `whole` (WORLD, which no member waits for here): every member's key. On Gloo a rank's
    init returns only once it read every peer's key, so whatever the script asks the store
    afterwards sees them all; a peer's own post may reach the coordinator later in wall time
    (a raw `list_keys` right after init missed one, once in CI). A made subgroup needs no more:
    its reply comes once every member's request, each after its post, has arrived."""
    for group_rank in (range(opts.group_size) if whole else [opts.group_rank]):
        simstore.post(opts.store, f"{prefix}0/{group_rank}", b"simdist")


def register() -> None:
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu", "cuda"])
