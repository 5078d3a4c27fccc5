"""The step-level network simulation at scale (issue 14): the replay without an event queue
gives exactly the event executor's times wherever it applies, says when it does not, and a
1,024-rank ring all_reduce equals its closed form."""

from __future__ import annotations

import numpy as np
import pytest

from simdist.collectives.algorithms import REGISTRY, make_schedule
from simdist.collectives.execute import schedule_time
from simdist.network import CollectiveRequest, CostModel, preset_network
from simdist.network.simulate import simulate, simulate_events, simulate_replay
from simdist.network.topology import PRESETS
from simdist.vocab import ROOTED_OPS

SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33, 48, 64)
RING_FAMILY = {("all_reduce", "ring"), ("all_gather", "ring"), ("reduce_scatter", "ring")}


def _same(a, b) -> bool:
    """Bit-for-bit equal results: finish times, every rank's finish, every message's begin and end."""
    return (a.finish == b.finish and a.rank_finish == b.rank_finish and len(a.transfers) == len(b.transfers)
            and np.array_equal(a.transfers.begin, b.transfers.begin) and np.array_equal(a.transfers.end, b.transfers.end)
            and np.array_equal(a.transfers.src, b.transfers.src) and np.array_equal(a.transfers.step, b.transfers.step))


def _request(op: str, algo: str, p: int) -> CollectiveRequest:
    n = 0 if op == "barrier" else 3 * 4096 + 5  # uneven blocks: not a multiple of p
    return CollectiveRequest(op, n, list(range(p)), algo=algo, root=p // 2 if op in ROOTED_OPS else None)


@pytest.mark.parametrize("preset", PRESETS)
def test_replay_equals_events_on_every_algorithm(preset):
    """Where the replay applies, its times are the event executor's, exactly. It applies to
    everything on a non-blocking switch, to the ring family everywhere, and to schedules that
    queue on shared links (two_nodes' NICs) when they queue the same way every step."""
    queued = replayed = total = 0
    for p in SIZES:
        if preset == "switch8" and p > 8:
            continue
        net = preset_network(preset, p)
        for op, algo in sorted(REGISTRY):
            req = _request(op, algo, p)
            fast = simulate_replay(net, [req])
            total += 1
            if preset in ("loopback", "switch8") or (op, algo) in RING_FAMILY:
                assert fast is not None, (preset, p, op, algo)
            if fast is None:
                continue
            replayed += 1
            slow = simulate_events(net, [req])
            assert _same(fast[0], slow[0]), (preset, p, op, algo)
            sched = make_schedule(op, algo, p, req.nbytes, req.ranks.index(req.root) if req.root is not None else 0)
            alone = schedule_time(sched, net.pair_costs, net.gamma)
            queued += fast[0].duration > alone * 1.01
    assert replayed >= 0.95 * total
    if preset == "two_nodes":
        assert queued > 10  # contention within steps, replayed all the same


def test_replay_declines_what_only_events_can_order():
    """On the ring preset, folded Rabenseifner on 5 ranks reaches a link out of step order:
    the replay says so, and `simulate` answers with the events."""
    net = preset_network("ring", 5)
    req = CollectiveRequest("all_reduce", 3 * 4096 + 5, list(range(5)), algo="rabenseifner")
    assert simulate_replay(net, [req]) is None
    assert _same(simulate(net, [req])[0], simulate_events(net, [req])[0])


def test_collectives_sharing_links_go_to_events_and_disjoint_ones_replay():
    net = preset_network("two_nodes", 4)
    both = [CollectiveRequest("all_reduce", 1 << 20, [0, 1, 2, 3], algo="ring"),
            CollectiveRequest("send", 1 << 20, [0, 3], start=1e-6)]
    assert simulate_replay(net, both) is None
    net = preset_network("loopback", 4)
    apart = [CollectiveRequest("all_reduce", 1 << 20, [0, 1], algo="ring"),
             CollectiveRequest("all_reduce", 1 << 20, [2, 3], algo="ring", start=1e-6)]
    fast = simulate_replay(net, apart)
    assert fast is not None
    for a, b in zip(fast, simulate_events(net, apart), strict=True):
        assert _same(a, b)


def test_utilization_is_the_same_from_both_executors():
    net = preset_network("two_nodes", 8)
    req = [CollectiveRequest("all_to_all", 1 << 20, list(range(8)), algo="pairwise")]
    u_fast: dict = {}
    u_slow: dict = {}
    assert simulate_replay(net, req, utilization=u_fast) is not None
    simulate_events(net, req, utilization=u_slow)
    assert u_fast == u_slow and u_fast and max(u_fast.values()) > 0.5  # the NIC link is busy most of the time


def test_ring_all_reduce_on_1024_ranks_equals_the_closed_form():
    """The acceptance case of issue 14 (its time budget is in bench/scale_network.py)."""
    p, n = 1024, 1 << 20
    base = preset_network("loopback", p)
    alpha, beta = base.uniform_params()
    cm = CostModel.from_params(p, alpha, beta, base.gamma)
    res = simulate(cm.network, [CollectiveRequest("all_reduce", n, list(range(p)), algo="ring")], record=False)[0]
    want = REGISTRY[("all_reduce", "ring")].time(p, n, alpha, beta, base.gamma)
    assert res.duration == pytest.approx(want, rel=1e-9)
    assert len(res.rank_finish) == p


def test_transfer_log_columns_and_per_rank_view_agree():
    net = preset_network("loopback", 12)
    res = simulate(net, [CollectiveRequest("all_reduce", 12 * 1000 + 7, list(range(12)), algo="rabenseifner")])[0]
    log = res.transfers
    records = list(log)
    assert len(records) == len(log) == make_schedule("all_reduce", "rabenseifner", 12, 12007).messages
    mine = log.sent_by([0, 5])
    assert [(t.step, t.dst, t.begin, t.end) for t in mine] == \
        [(t.step, t.dst, t.begin, t.end) for t in records if t.src in (0, 5)]
    assert max(t.end for t in records) == res.finish


def test_routes_of_many_pairs_at_once_are_the_routes_pair_by_pair():
    """Above a few pairs, tree routes and pair costs come from arrays of ancestors; they must
    be the routes and sums the pair-by-pair search gives, on every tree preset and on a
    deeper custom tree with several ranks on one host (ports)."""
    from simdist.network import scenario_network
    from simdist.schema import Topology

    custom = Topology(nodes=[{"name": "core", "kind": "switch"}, {"name": "leaf0", "kind": "switch"},
                             {"name": "leaf1", "kind": "switch"},
                             {"name": "h0", "kind": "host", "ranks": list(range(0, 40))},
                             {"name": "h1", "kind": "host", "ranks": list(range(40, 70))},
                             {"name": "h2", "kind": "gpu", "ranks": [70]}],
                      links=[{"a": "core", "b": "leaf0", "latency_us": 3, "bandwidth_gbps": 10},
                             {"a": "core", "b": "leaf1", "latency_us": 4, "bandwidth_gbps": 12},
                             {"a": "leaf0", "b": "h0", "latency_us": 1, "bandwidth_gbps": 20},
                             {"a": "leaf1", "b": "h1", "latency_us": 1.5, "bandwidth_gbps": 25},
                             {"a": "core", "b": "h2", "latency_us": 2, "bandwidth_gbps": 50}])
    nets = [preset_network(name, 80) for name in ("loopback", "two_nodes")] + [scenario_network(custom, 71)]
    for net in nets:
        p = net.world_size
        src = np.repeat(np.arange(p), p)
        dst = np.tile(np.arange(p), p)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        assert net.router.tree is not None
        hops = net.links.routes(src, dst)
        alpha, beta = net.pair_costs(src, dst)
        for j in range(0, len(src), 7):
            a, b = int(src[j]), int(dst[j])
            assert tuple(int(x) for x in hops[:, j] if x >= 0) == net.links.route(a, b), (net.name, a, b)
            assert (alpha[j], beta[j]) == net.pair_cost(a, b)
    # and the executors on the array routes: replay equals events at 96 ranks on two_nodes
    net = preset_network("two_nodes", 96)
    for op, algo in (("all_reduce", "ring"), ("all_to_all", "pairwise"), ("broadcast", "tree")):
        req = [CollectiveRequest(op, 96 * 1000, list(range(96)), algo=algo)]
        fast = simulate_replay(net, req)
        assert fast is not None and _same(fast[0], simulate_events(net, req)[0]), (op, algo)
