"""TORCH_DISTRIBUTED_DEBUG=DETAIL (c10d's ProcessGroupWrapper, `simdist.script.rank.pgwrapper`):
each case of tests/scripts/debug_detail.py on simulated ranks and on real Gloo agrees, world
sizes 2 and 3: the per-rank operations (the wrapper's fingerprint all_gathers included), how
each rank ends, its error's exact text and line, its printed lines."""

from __future__ import annotations

import re

import pytest

from simdist.report import Report
from simdist.script import run_script
from simdist.script.launch import new_run_id, tagged_processes
from simdist.script.rank.fingerprint import MISMATCH
from simdist.script.stalls import EARLY
from tests.conftest import ROOT, descendants
from tests.test_script_examples import differences, differences_but_noted_races

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "debug_detail.py"
_GLOO_ADDRESS = re.compile(r"\[127\.0\.0\.1\]:\d+")  # a peer's port: the run's own


def _line(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def _run(case: str, n: int, mode: str, zygote) -> Report:
    run_id, z = new_run_id(), zygote(mode)
    report = run_script(SCRIPT, ["--case", case], nproc_per_node=n, backend="gloo", mode=mode, timeout_s=120,
                        run_id=run_id, measure_compute=False, zygote=z)
    assert tagged_processes(run_id) == [] and descendants(z.pid) == []
    return report


def _ends(report: Report) -> list[tuple]:
    """How each rank ended: status, error type and text, and line (a killed real rank has none)."""
    return [(r.status, r.error and r.error.type, r.error and _GLOO_ADDRESS.sub("[peer]", r.error.message),
             r.location.line if r.location and not (r.error and r.error.category == "killed") else None)
            for r in report.ranks]


def _ok(rep: Report, n: int) -> None:
    assert [r.status for r in rep.ranks] == ["completed"] * n
    # the warm-up all_reduce of 4 values, after the wrapper's length and fingerprint all_gathers
    assert [(e.op, e.numel, e.dtype, e.group) for e in rep.ranks[0].trace[:3]] == [
        ("all_gather", 1, "int64", "pg"), ("all_gather", 7, "int64", "pg"), ("all_reduce", 4, "float32", "pg")]


def _shape(rep: Report, n: int) -> None:
    assert all(r.error.message.startswith(f"{MISMATCH} Rank {r.rank} is running collective") for r in rep.ranks)
    assert rep.ranks[0].error.message.endswith("Tensor Tensor shapes: 2vs 3")
    assert [r.location.line for r in rep.ranks] == [_line("dist.all_reduce(t)")] * n


def _op(rep: Report, n: int) -> None:
    assert rep.ranks[0].error.message.endswith("Op type: ALLREDUCEvs BROADCAST")
    assert rep.ranks[-1].error.message.endswith("Op type: BROADCASTvs ALLREDUCE")


def _skip(rep: Report, n: int) -> None:
    # rank 0's third batch meets the others' loss: the same sequence number, another shape
    assert [r.location.line for r in rep.ranks] == [_line("dist.all_reduce(grad)")] + [_line("dist.all_reduce(loss)")] * (n - 1)
    assert "SequenceNumber=3, OpType=ALLREDUCE, TensorShape=[4]" in rep.ranks[0].error.message


def _skip_exit(rep: Report, n: int) -> None:
    # the others left: the wrapper's monitored barrier names every one (wait_all_ranks)
    missing = ", ".join(str(r) for r in range(1, n))
    assert rep.ranks[0].error.message == f"[Rank 0]: Ranks {missing} failed to pass monitoredBarrier in 1800000 ms"
    # ... and return; on real torchrun the agent's SIGTERM for rank 0's failure may come first
    # (the simulated report notes that race on them: checked by the caller)
    assert all(r.status == "completed" or (rep.source == "real" and r.error.category == "killed")
               for r in rep.ranks[1:]), [r.status for r in rep.ranks]
    assert rep.source == "real" or [r.status for r in rep.ranks[1:]] == ["completed"] * (n - 1)


def _ddp(rep: Report, n: int) -> None:
    assert [(r.status, r.exit) for r in rep.ranks] == [("error", "killed by signal 11")] * n
    assert all(r.output[-1] == f"rank {r.rank}: wrapping" for r in rep.ranks)


def _p2p(rep: Report, n: int) -> None:
    if n == 2:  # both took part in the send: their counts agree
        assert [r.status for r in rep.ranks] == ["completed"] * n
    else:
        assert rep.ranks[2].error.message.endswith("Sequence number: 1vs 2")


def _stuck(rep: Report, n: int) -> None:
    # the others wait for the last rank in the wrapper's monitored barrier, which no Flight
    # Recorder entry shows (real Gloo's early hang verdict reads that wait: `rank.stall.wrapper_wait`)
    assert rep.outcome == "hang"
    assert [r.location.line for r in rep.ranks] == [_line("waits for the last rank")] * (n - 1) + [_line("# rank 0 never sends")]
    if rep.source == "real":  # found by the stall check, not the run's watchdog long after
        assert any(note.startswith(EARLY) for note in rep.notes), rep.notes


def _ndim(rep: Report, n: int) -> None:
    assert rep.ranks[0].error.message.startswith(MISMATCH)
    assert all(r.error.message.endswith("please report a bug to PyTorch. Unknown op type!") for r in rep.ranks[1:])


def _keys(rep: Report, n: int) -> None:
    assert [r.status for r in rep.ranks] == ["completed"] * n


EXPECT = {"ok": _ok, "shape": _shape, "op": _op, "skip": _skip, "skip_exit": _skip_exit, "ddp": _ddp, "p2p": _p2p,
          "keys": _keys, "stuck": _stuck, "ndim": _ndim}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", list(EXPECT))
def test_detail_case_agrees_with_real_gloo(case, n, script_zygote, monkeypatch):
    """A forked rank reads the run's environment at its fork (`forkserver.apply_torch_env`), so
    DETAIL is set there; the script's own setting before `import torch` is tested below."""
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    sim, real = _run(case, n, "sim", script_zygote), _run(case, n, "gloo", script_zygote)
    for rep in (sim, real):
        EXPECT[case](rep, n)
    assert _ends(sim) == _ends(real) or case == "skip_exit"
    # (skip_exit: the others return as rank 0 fails; torchrun's SIGTERM may come first, a noted race)
    assert differences_but_noted_races(sim, real) == []
    assert [r.output for r in sim.ranks] == [r.output for r in real.ranks] or case == "skip_exit"


def test_ddp_under_detail_names_its_sigsegv(script_zygote, monkeypatch):
    """Real Gloo's rank dies with no word; the simulated one says why before it dies."""
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    sim = _run("ddp", 2, "sim", script_zygote)
    assert sorted(n.split(":")[0] for n in sim.notes if "died by SIGSEGV in DistributedDataParallel" in n) == \
        ["rank 0", "rank 1"]


def test_detail_set_by_the_script_reaches_a_launched_rank():
    """The script sets DETAIL itself before `import torch`: a rank started afresh (the CLI's
    `run` and `compare`) reads it on both sides; a zygote's rank, whose torch was imported
    before the script ran, would not (docs/script-backend.md)."""
    reports = [run_script(SCRIPT, ["--case", "shape"], nproc_per_node=2, backend="gloo", mode=mode, timeout_s=120,
                          measure_compute=False) for mode in ("sim", "gloo")]
    for rep in reports:
        _shape(rep, 2)
    assert _ends(reports[0]) == _ends(reports[1])
    assert differences(*reports) == []
