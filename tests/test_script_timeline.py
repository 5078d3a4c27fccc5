"""A script's timeline: each rank's measured compute between operations (compute spans on its
simulated clock) and communication timed by the cost model of the chosen topology
(`--topology`: a preset or a scenario's [topology] table), drawn in the Chrome trace."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from simdist.errors import ScriptError
from simdist.network.cost import CostModel
from simdist.scenario import Topology, load_topology
from simdist.script import run_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import descendants, run_cli

pytestmark = pytest.mark.real

SCRIPT = """
import time, torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.randn(300, 300)
t0 = time.thread_time()  # the main thread's CPU time: what a rank's compute is measured by
while time.thread_time() - t0 < 0.2 * (rank + 1):  # rank 1 computes twice as long
    x = (x @ x).tanh()
t = torch.ones(1 << 18)  # 1 MiB of float32
dist.all_reduce(t)
print(int(t[0].item()))
"""

SLOW_LINK = """
[topology]
nodes = [{name = "a", ranks = [0]}, {name = "b", ranks = [1]}]
links = [{a = "a", b = "b", latency_us = 500.0, bandwidth_gbps = 0.1}]
"""


def _run(tmp_path, zygote, **kw):
    """The script on 2 simulated ranks forked by the session's zygote (`script_zygote`)."""
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    run_id, z = new_run_id(), zygote("sim")
    rep = run_script(p, nproc_per_node=2, timeout_s=300, run_id=run_id, zygote=z, **kw)
    assert tagged_processes(run_id) == [] and descendants(z.pid) == []
    assert rep.outcome == "completed" and [r.output for r in rep.ranks] == [["2"], ["2"]]
    return rep


def _comm(rep) -> float:
    (a0,), (a1,) = (r.trace for r in rep.ranks)
    assert a0.t_done == a1.t_done
    return a0.t_done - max(a0.t_issue, a1.t_issue)


def test_communication_is_timed_on_the_chosen_topology(tmp_path, script_zygote):
    (tmp_path / "slow.toml").write_text(textwrap.dedent(SLOW_LINK))
    fast = _run(tmp_path, script_zygote, measure_compute=False)
    slow = _run(tmp_path, script_zygote, measure_compute=False, topology=tmp_path / "slow.toml")
    for rep, topo in ((fast, Topology()), (slow, load_topology(tmp_path / "slow.toml"))):
        want = CostModel.from_scenario_topology(topo, 2).collective_time("all_reduce", 1 << 20, [0, 1])
        assert _comm(rep) == pytest.approx(want, rel=1e-9) and want > 0
        assert [r.compute for r in rep.ranks] == [[], []]  # compute not measured: times are the model's alone
        assert [r.time for r in rep.ranks] == [pytest.approx(want)] * 2
    assert _comm(slow) > 10 * _comm(fast)


def test_measured_compute_is_on_the_timeline_between_operations(tmp_path, script_zygote):
    rep = _run(tmp_path, script_zygote, topology="two_nodes")
    r0, r1 = rep.ranks
    for r in rep.ranks:
        assert r.compute and all(s.t_end > s.t_begin for s in r.compute)
        op = r.trace[0]  # a blocking all_reduce: the rank computes before and after it, not during
        assert all(s.t_end <= op.t_issue + 1e-9 or s.t_begin >= op.t_done - 1e-9 for s in r.compute)
        assert r.compute[-1].t_end == pytest.approx(r.time)  # its last work (the print) ends its time
    busy0, busy1 = (sum(s.t_end - s.t_begin for s in r.compute if s.t_end <= r.trace[0].t_issue + 1e-9)
                    for r in (r0, r1))
    assert busy0 >= 0.2 and busy1 >= 0.4 and busy1 > busy0
    # the all_reduce starts when the later rank arrives, and both ranks leave it together
    assert r0.trace[0].t_done == r1.trace[0].t_done >= r1.trace[0].t_issue + _comm(rep) - 1e-9
    want = CostModel.from_scenario_topology(Topology(preset="two_nodes"), 2).collective_time(
        "all_reduce", 1 << 20, [0, 1])
    assert _comm(rep) == pytest.approx(want, rel=1e-9)


def test_the_chrome_trace_draws_compute_and_communication(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    out = tmp_path / "trace.json"
    res = run_cli("run", str(p), "--nproc-per-node", "2", "--trace-out", str(out), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    events = json.loads(out.read_text())["traceEvents"]
    names = {(e.get("pid"), e.get("name")) for e in events if e.get("ph") == "X"}
    for pid in (1, 2):
        assert (pid, "compute") in names and any(n and "all_reduce" in n for q, n in names if q == pid)


def test_a_topology_that_cannot_hold_the_world_is_bad_input(tmp_path):
    (tmp_path / "one.toml").write_text('[topology]\nnodes = [{name = "a", ranks = [0]}]\n')
    p = tmp_path / "train.py"
    p.write_text(SCRIPT)
    run_id = new_run_id()
    with pytest.raises(ScriptError, match=r"topology.nodes: ranks \[1\] are not placed on any node"):
        run_script(p, nproc_per_node=2, timeout_s=300, run_id=run_id, stdout=subprocess.DEVNULL,
                   topology=tmp_path / "one.toml")
    assert tagged_processes(run_id) == []
    res = run_cli("run", str(p), "--topology", "nowhere")
    assert res.returncode == 2 and "topology: 'nowhere' is neither a preset" in res.stderr
