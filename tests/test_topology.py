"""Topologies, routing, FIFO links and contention, and the CostModel interface."""

from __future__ import annotations

import time

import pytest

from simdist.collectives import REGISTRY, algorithms_for
from simdist.errors import ScenarioError
from simdist.network import CollectiveRequest, CostModel, preset_network, scenario_network, simulate, uniform_network
from simdist.scenario import TopoLink, Topology, TopoNode

MB = 1 << 20


def _two_hosts_one_link(latency_us: float = 0.0, gbps: float = 1.0) -> Topology:
    return Topology(
        nodes=[TopoNode(name="a", ranks=[0]), TopoNode(name="b", ranks=[1])],
        links=[TopoLink(a="a", b="b", latency_us=latency_us, bandwidth_gbps=gbps)],
    )


# --------------------------------------------------------------------------- building
@pytest.mark.parametrize("preset", ["loopback", "switch8", "two_nodes", "ring"])
def test_presets_build_and_route(preset):
    for p in (1, 2, 3, 8):
        net = preset_network(preset, p)
        for i in range(p):
            for j in range(p):
                a, b = net.pair_cost(i, j)
                assert (a > 0 and b > 0) if i != j else (a, b) == (0.0, 0.0)


def test_preset_errors_name_the_field():
    with pytest.raises(ScenarioError) as e:
        CostModel.from_scenario_topology(Topology(preset="foo"), 4)
    assert str(e.value) == "topology.preset: unknown preset 'foo' (choose from loopback, switch8, two_nodes, ring)"
    with pytest.raises(ScenarioError, match=r"^topology.preset: switch8 has 8 GPUs"):
        CostModel.from_scenario_topology(Topology(preset="switch8"), 9)
    with pytest.raises(ScenarioError, match=r"^topology.algorithms.all_reduce: unknown algorithm 'best'"):
        CostModel.from_scenario_topology(Topology(algorithms={"all_reduce": "best"}), 4)
    with pytest.raises(ScenarioError, match=r"^topology.algorithms.allreduce: unknown collective"):
        CostModel.from_scenario_topology(Topology(algorithms={"allreduce": "ring"}), 4)


def test_disconnected_topology_is_rejected():
    topo = Topology(
        nodes=[TopoNode(name="a", ranks=[0]), TopoNode(name="b", ranks=[1]), TopoNode(name="c", ranks=[2])],
        links=[TopoLink(a="a", b="b", latency_us=1, bandwidth_gbps=1)],
    )
    with pytest.raises(ScenarioError, match=r"^topology.links: ranks \[2\] cannot reach rank 0"):
        CostModel.from_scenario_topology(topo, 3)


def test_ring_routes_are_multi_hop_store_and_forward():
    net = preset_network("ring", 6)
    assert len(net.route(0, 1)) == 1
    assert len(net.route(0, 3)) == 3
    assert len(net.route(0, 5)) == 1  # the short way round
    a1, b1 = net.pair_cost(0, 1)
    a3, b3 = net.pair_cost(0, 3)
    assert a3 == pytest.approx(3 * a1) and b3 == pytest.approx(3 * b1)
    assert not net.is_uniform()


def test_custom_topology_with_shared_host():
    topo = Topology(
        nodes=[
            TopoNode(name="h0", ranks=[0, 1]),
            TopoNode(name="h1", ranks=[2, 3]),
            TopoNode(name="sw", kind="switch"),
        ],
        links=[
            TopoLink(a="h0", b="sw", latency_us=5, bandwidth_gbps=10),
            TopoLink(a="h1", b="sw", latency_us=5, bandwidth_gbps=10),
        ],
    )
    net = scenario_network(topo, 4)
    assert len(net.route(0, 1)) == 2  # port -> host -> port
    assert len(net.route(0, 2)) == 4  # port -> h0 -> sw -> h1 -> port
    assert net.pair_cost(0, 2)[0] > net.pair_cost(0, 1)[0]


# --------------------------------------------------------------------------- contention
def test_contention_doubles_time_on_one_shared_link():
    topo = _two_hosts_one_link(latency_us=0.0, gbps=1.0)
    net = scenario_network(topo, 2)
    one = simulate(net, [CollectiveRequest("send", 10 * MB, [0, 1])])
    two = simulate(net, [CollectiveRequest("send", 10 * MB, [0, 1]), CollectiveRequest("send", 10 * MB, [0, 1])])
    t1 = one[0].finish
    assert t1 == pytest.approx(10 * MB / 1e9)
    assert max(r.finish for r in two) == pytest.approx(2 * t1)
    assert sorted(r.finish for r in two) == pytest.approx([t1, 2 * t1])


def test_contention_with_latency_is_fifo():
    net = scenario_network(_two_hosts_one_link(latency_us=100.0, gbps=1.0), 2)
    res = simulate(net, [CollectiveRequest("send", MB, [0, 1]), CollectiveRequest("send", MB, [0, 1], start=0.0)])
    ser = MB / 1e9
    assert sorted(r.finish for r in res) == pytest.approx([ser + 1e-4, 2 * ser + 1e-4])


def test_opposite_directions_do_not_contend():
    net = scenario_network(_two_hosts_one_link(latency_us=0.0, gbps=1.0), 2)
    res = simulate(net, [CollectiveRequest("send", MB, [0, 1]), CollectiveRequest("send", MB, [1, 0])])
    assert res[0].finish == pytest.approx(res[1].finish) == pytest.approx(MB / 1e9)


def test_concurrent_collectives_share_links():
    net = scenario_network(_two_hosts_one_link(latency_us=1.0, gbps=10.0), 2)
    net.gamma = 0.0  # reductions are not a shared resource; look at the links alone
    alone = simulate(net, [CollectiveRequest("all_reduce", 8 * MB, [0, 1], algo="ring")])[0].duration
    both = simulate(
        net,
        [
            CollectiveRequest("all_reduce", 8 * MB, [0, 1], algo="ring"),
            CollectiveRequest("all_reduce", 8 * MB, [0, 1], algo="ring"),
        ],
    )
    assert max(r.finish for r in both) == pytest.approx(2 * alone, rel=0.01)
    net = preset_network("loopback", 4)
    # disjoint rank sets on a non-blocking hub do not slow each other down
    pair = simulate(
        net,
        [
            CollectiveRequest("all_reduce", 8 * MB, [0, 1], algo="ring"),
            CollectiveRequest("all_reduce", 8 * MB, [2, 3], algo="ring"),
        ],
    )
    solo = simulate(net, [CollectiveRequest("all_reduce", 8 * MB, [0, 1], algo="ring")])[0].duration
    assert pair[0].duration == pytest.approx(solo) and pair[1].duration == pytest.approx(solo)


def test_start_times_are_respected():
    net = preset_network("switch8", 4)
    r = simulate(net, [CollectiveRequest("broadcast", MB, [0, 1, 2, 3], start=1.0, algo="tree")])[0]
    assert r.start == 1.0 and r.finish > 1.0
    assert min(t.begin for t in r.transfers) == pytest.approx(1.0)


@pytest.mark.parametrize("preset", ["loopback", "switch8"])
def test_step_level_simulation_equals_closed_form_without_contention(preset):
    for (op, algo), a in sorted(REGISTRY.items()):
        for p in (2, 3, 4, 5, 8):
            net = preset_network(preset, p)
            alpha, beta = net.uniform_params()
            n = 0 if op == "barrier" else 8 * 7 * 5 * 3 * 64
            res = simulate(net, [CollectiveRequest(op, n, list(range(p)), algo=algo)])[0]
            assert res.duration == pytest.approx(a.time(p, n, alpha, beta, net.gamma), rel=1e-9), (op, algo, p)


# --------------------------------------------------------------------------- CostModel
def test_cost_model_closed_form_and_p2p():
    cm = CostModel.from_scenario_topology(Topology(preset="switch8"), 8)
    assert cm.uniform
    t = cm.collective_time("all_reduce", 64 * MB, list(range(8)), algo="ring")
    assert t == pytest.approx(REGISTRY[("all_reduce", "ring")].time(8, 64 * MB, cm.alpha, cm.beta, cm.gamma))
    assert cm.p2p_time(MB, 0, 3) == pytest.approx(cm.alpha + MB * cm.beta)
    assert cm.p2p_time(MB, 2, 2) == 0.0
    assert cm.collective_time("all_reduce", MB, [5]) == 0.0


def test_cost_model_overrides_and_algorithm_choice():
    topo = Topology(preset="loopback", alpha=1e-4, beta=1e-9, gamma=0.0, algorithms={"all_reduce": "tree"})
    cm = CostModel.from_scenario_topology(topo, 4)
    assert (cm.alpha, cm.beta, cm.gamma) == (1e-4, 1e-9, 0.0)
    assert cm.choose("all_reduce", MB, 4) == "tree"
    assert cm.collective_time("all_reduce", MB, [0, 1, 2, 3]) == pytest.approx(4 * 1e-4 + 4 * MB * 1e-9)
    # auto: smallest predicted time, small messages favour few steps, large ones the ring family
    auto = CostModel.from_params(16, 1e-4, 1e-9, 0.0)
    assert auto.choose("all_reduce", 8, 16) == "recursive_doubling"
    big = auto.choose("all_reduce", 256 * MB, 16)
    assert big in ("ring", "rabenseifner")
    times = {
        a: auto.collective_time("all_reduce", 256 * MB, list(range(16)), algo=a) for a in algorithms_for("all_reduce")
    }
    assert auto.collective_time("all_reduce", 256 * MB, list(range(16))) == pytest.approx(min(times.values()))


def test_cost_model_non_uniform_uses_routes():
    cm = CostModel.from_scenario_topology(Topology(preset="two_nodes"), 4)
    assert not cm.uniform
    intra = cm.p2p_time(MB, 0, 1)
    inter = cm.p2p_time(MB, 0, 2)
    assert inter > intra
    t_intra = cm.collective_time("all_reduce", MB, [0, 1], algo="ring")
    t_all = cm.collective_time("all_reduce", MB, [0, 1, 2, 3], algo="ring")
    assert t_all > t_intra > 0
    # cached and fast on repeat
    t0 = time.perf_counter()
    for _ in range(20000):
        cm.collective_time("all_reduce", MB, [0, 1, 2, 3], algo="ring")
    assert time.perf_counter() - t0 < 2.0


def test_cost_model_uniform_is_fast():
    cm = CostModel.from_scenario_topology(Topology(preset="loopback"), 8)
    ranks = list(range(8))
    t0 = time.perf_counter()
    for i in range(50000):
        cm.collective_time("all_reduce", 4096 * (1 + i % 16), ranks)
    assert time.perf_counter() - t0 < 2.0


def test_uniform_network_realises_alpha_beta():
    net = uniform_network(5, 2e-5, 1e-9, 0.0)
    a, b = net.pair_cost(0, 4)
    assert a == pytest.approx(2e-5) and b == pytest.approx(1e-9)
