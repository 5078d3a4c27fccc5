"""A rank the fork server (zygote) forks ends as `python SCRIPT` does: the fork server's
`leave` does the interpreter's shutdown in the interpreter's order (`simdist.forkserver`).
Every test that runs a script through `script_zygote` relies on it."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_script_examples import _run, _verdict, differences
from tests.test_script_modern_apis import _both

LEFT_OPEN = ROOT / "tests" / "scripts" / "file_left_open.py"


@pytest.mark.real
def test_an_idle_thread_pool_left_open_does_not_keep_a_forked_rank(script_zygote):
    """tests/scripts/thread_pool_left_open.py: each rank leaves an idle ThreadPoolExecutor
    open when it ends. Started as `python SCRIPT` (`simdist compare`) every rank ended; forked
    by the zygote each hung in its exit until the watchdog (300 s here): the fork server
    joined the pool's threads before `concurrent.futures`' exit hook woke them. torch.compile's
    inductor leaves such a pool (tests/test_script_compiled_gpus.py's inductor cases hung on
    a cold cache)."""
    sim, real = _both("thread_pool_left_open.py", 2, script_zygote)
    assert _verdict(sim) == _verdict(real) == ["completed"] * 2
    assert differences(sim, real) == []
    assert [r.output for r in sim.ranks] == [[f"[rank{r}] squares [0, 1, 4, 9] total 29.0"] for r in (0, 1)]


def _lines(rank: int) -> str:
    """What each file of `rank` holds (tests/scripts/file_left_open.py)."""
    return "".join(f"rank {rank} step {s}\n" for s in range(3))


def _files(folder) -> dict[str, str]:
    return {p.name: (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)).read() for p in sorted(folder.iterdir())}


def _plain_python(folder) -> None:
    """The script as `python SCRIPT` runs it, one rank, no simdist (no bootstrap on the path)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMDIST") and k != "PYTHONPATH"}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    subprocess.run([sys.executable, str(LEFT_OPEN), str(folder)], env=env, check=True, timeout=120, capture_output=True)


@pytest.mark.real
def test_files_left_open_are_written_out_as_the_interpreter_does(script_zygote, tmp_path):
    """tests/scripts/file_left_open.py: each rank ends with a log file and a gzip file it never
    closed. Run as plain `python SCRIPT`, the interpreter's shutdown closes both: the log
    holds its lines, the gzip file is whole. A simulated or real-Gloo rank ends by `os._exit`
    after writing out what is left open (`rank/exits._flush_open_files`): flushed only, the
    gzip file lacked its end ("Compressed file ended before the end-of-stream marker was
    reached"), on both sides."""
    folders = {name: tmp_path / name for name in ("plain", "sim", "gloo")}
    for folder in folders.values():
        folder.mkdir()
    _plain_python(folders["plain"])
    assert _files(folders["plain"]) == {"rank0.log": _lines(0), "rank0.log.gz": _lines(0)}
    reports = {mode: _run({"script": f"../{LEFT_OPEN.relative_to(ROOT)}", "nproc": 2, "args": [str(folders[mode])]},
                          mode, script_zygote) for mode in ("sim", "gloo")}
    assert differences(reports["sim"], reports["gloo"]) == []
    for mode, report in reports.items():
        assert _verdict(report) == ["completed"] * 2, mode
        assert _files(folders[mode]) == {f"rank{r}.log{z}": _lines(r) for r in (0, 1) for z in ("", ".gz")}, mode
