"""Device moves inside a `torch.compile`d function (`x.to(device)`, `.to("cuda")`, `.cuda()`,
`.cpu()`, a factory's `device=`) on the simulated GPUs compile as on a GPU: one graph per
function, no graph break, the results where a GPU puts them (`rank/compiled_moves.py`).

tests/scripts/compiled_moves.py picks its device as scripts do (`"cuda" if
torch.cuda.is_available() else "cpu"`) and prints only what is the same on either machine
(values, graphs and graph breaks, whether each result is on `device` or the host), so the same
lines must come from: the simulated GPUs and real Gloo with them, a CPU-only node
(`--gpus-per-node 0`) simulated and on real Gloo, and plain torchrun on this CPU-only host."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.test_script_cpu_node import torchrun
from tests.test_script_examples import _verdict, differences
from tests.test_third_party_scripts import _both

SCRIPT = ROOT / "tests" / "scripts" / "compiled_moves.py"


def _printed(report) -> list[str]:
    return sorted(line for r in report.ranks for line in r.output if line.startswith("[rank"))


@pytest.mark.real
@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_moves_in_a_compiled_function_compile_whole_and_print_what_the_cpu_run_prints(
        backend, script_zygote, cpu_node_zygote, tmp_path):
    """`fullgraph=True`, so a graph break would raise. Before (b74f561), on the simulated GPUs
    each move was a graph break ("Dynamo does not know how to trace the builtin
    `TensorBase.to`": 4 graphs and 7 breaks without `fullgraph`, `Unsupported` with it), where
    the CPU run (and a GPU) compiles 2 graphs and no break, and `(y + 1).to(y.device)` of a GPU
    `y` came back as host memory ("moved to y.device on device False"). Before 5dc3e58's review
    (`mixed`), `x.to(other_tensor)` was a graph break ("Unsupported hasattr call"), three
    results that a GPU (and the CPU run) leaves in host memory were on the device: an op on a
    `.cpu()` result, a factory given no device, and one sized by a device tensor
    ("on cpu False"), and `x.to(y.device)` of a host `x` in a graph with `y` was host memory
    (with the break fixed, a factory placed on "cpu" was on the device too). Slow with
    inductor: it compiles C++ kernels on each rank, 5 runs."""
    args = ["--backend", backend, "--fullgraph"]
    lines = {}
    for node, zygote in (("gpus", script_zygote), ("cpu", cpu_node_zygote)):
        (tmp_path / node).mkdir()
        sim, real = _both(SCRIPT, 2, args, zygote, tmp_path / node)
        assert _verdict(sim) == ["completed"] * 2, node
        assert differences(sim, real) == [], node
        lines[node] = _printed(sim)
    assert lines["gpus"] == lines["cpu"]
    here, plain = torchrun(SCRIPT, args, tmp_path)
    assert here.returncode == 0, here.stderr
    assert plain == lines["cpu"]
    assert plain.count("[rank1] compiled: frames 3, graph breaks 0") == 1
    on_device = [line for line in plain if " on device " in line]
    assert len(on_device) == 6 and not any("False" in line for line in on_device)
    assert all("moved to y.device on device True" in line for line in on_device if "summary" in line)


def test_where_a_graphs_outputs_are_is_read_off_its_moves_then_its_operands():
    """In-process, `compiled_moves.output_sources` on an FX graph: a move's result is on its
    device (-1 the host), an op's on its operands' (in order: the first on a GPU decides at
    each call), `x.to(other)` on `other`'s, a factory or `x.to(y.device)` given a device (a CPU
    device object in a graph) on the graph's GPU (after the operands), one given none in host
    memory; a graph without a move gets no
    plan (its outputs are placed as before)."""
    import torch
    import torch.fx

    from simdist.script.rank import compiled_moves

    compiled_moves.install()
    place = compiled_moves.PLACE

    def moves(a, b):
        h = place(a, 1)
        c = torch.add(b, h)
        return h, c, place(c, compiled_moves.HOST), b, torch.ones_like(b).sum().new_ones(3)

    graph = torch.fx.symbolic_trace(moves)
    assert compiled_moves.output_sources(graph) == [
        (("gpu", 1),), (("in", 1), ("gpu", 1)), (), (("in", 1),), (("in", 1),)]
    graph.graph.create_node("call_function", torch.zeros, ((3,),), {"device": torch.device("cpu")}, name="placed")
    graph.graph.create_node("call_function", torch.zeros, ((3,),), name="host")
    assert [compiled_moves._node_sources(n, {}) for n in list(graph.graph.nodes)[-2:]] == [(("graph", 0),), ()]
    like = torch.fx.symbolic_trace(lambda a, b: (a.to(b), a.to(torch.float64) + b, a.to(torch.device("cpu"))))
    assert compiled_moves.output_sources(like) == [(("in", 1),), (("in", 0), ("in", 1)), (("in", 0), ("graph", 0))]
    assert compiled_moves.output_sources(torch.fx.symbolic_trace(lambda a: a * 2)) is None
