"""What a user reads when their script never gets as far as a process group: which process
ended how and where, an init that was called and raised said so with torch's own error, and
advice that fits how the script starts its ranks (`simdist.script.api.never_initialised`)."""

from __future__ import annotations

import re

import pytest

from simdist.errors import ScriptError
from simdist.script.api import run_script
from simdist.script.launch import new_run_id, tagged_processes
from simdist.script.rank.patches import rank_and_size
from tests.conftest import ROOT, line_of

SCRIPTS = ROOT / "tests" / "scripts"
TORCHRUN_HINT = "a script that torchrun starts needs --nproc-per-node N"


def _never(zygote, script: str, args: list[str]) -> str:
    run_id = new_run_id()
    with pytest.raises(ScriptError) as e:
        run_script(SCRIPTS / script, args, nproc_per_node=None, backend="gloo", run_id=run_id,
                   measure_compute=False, timeout_s=60, zygote=zygote("sim"))
    assert tagged_processes(run_id) == []
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize(("method", "rank", "world_size", "environ"), [
    (None, -1, -1, {}), (None, -1, -1, {"RANK": "0"}), (None, 0, -1, {}), (None, -1, 2, {}),
    (None, -1, -1, {"RANK": "", "WORLD_SIZE": "2"}), (None, -1, -1, {"RANK": "x", "WORLD_SIZE": "2"}),
    ("env://?rank=0", 0, 1, {}), ("env://?world_size=2", -1, -1, {}),
    ("tcp://localhost:1234", -1, -1, {"RANK": "0", "WORLD_SIZE": "1"}), ("tcp://localhost:1234", 0, -1, {}),
    ("tcp://localhost", -1, -1, {}), ("file:///tmp/simdist-no-such", -1, -1, {}), ("file://", 0, 1, {}),
    ("foo://x", 0, 1, {}), (None, "0", 1, {}), (None, 0, None, {}),
])
def test_rank_and_size_raise_torchs_own_errors(monkeypatch, method, rank, world_size, environ):
    """Each case run through torch's own rendezvous (it raises before it makes any store) and
    through the rank layer: the same exception, word for word."""
    from torch.distributed.rendezvous import rendezvous

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(Exception) as torchs:
        next(rendezvous(method or "env://", rank=rank, world_size=world_size))
    with pytest.raises(Exception) as ours:
        rank_and_size(rank, world_size, method)
    assert (type(ours.value), str(ours.value)) == (type(torchs.value), str(torchs.value))


def test_rank_and_size_read_what_torch_reads(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert rank_and_size(-1, -1, None) == (1, 3)
    assert rank_and_size(0, -1, None) == (0, 3)  # the argument wins; the other from the environment
    assert rank_and_size(-1, -1, "tcp://h:1?rank=2&world_size=4") == (2, 4)
    assert rank_and_size(2, 4, None, store_given=True) == (2, 4)
    with pytest.raises(AssertionError, match="^rank must be non-negative if using store$"):
        rank_and_size(-1, 4, None, store_given=True)


def test_an_init_that_raised_is_said_to_have_been_called_with_torchs_error(script_zygote):
    """Not "no rank called init_process_group": the script's process called it, torch's
    rendezvous raised, and a script that wants torchrun's variables is told of --nproc-per-node."""
    at = line_of(SCRIPTS / "init_without_env.py", "dist.init_process_group(")
    for args, var in (([], "RANK"), (["0"], "WORLD_SIZE")):
        text = _never(script_zygote, "init_without_env.py", args)
        assert "never initialised a process group: the script's own process (pid " in text, text
        assert f") called init_process_group at init_without_env.py:{at}, which raised ValueError: Error " \
               f"initializing torch.distributed using env:// rendezvous: environment variable {var} expected, but " \
               f"not set (exit codes [1]); it ran as `python init_without_env.py` because --nproc-per-node was not " \
               f"given: {TORCHRUN_HINT}" in text, text
        assert "no rank called" not in text


def test_an_mp_spawn_script_whose_ranks_raise_before_init_is_told_what_happened(script_zygote):
    """Which process raised what at which line, and no --nproc-per-node advice: the script
    starts its own ranks."""
    at = line_of(SCRIPTS / "spawn_raise_before_init.py", "raise ValueError(")
    text = _never(script_zygote, "spawn_raise_before_init.py", ["2"])
    # (which child reports first is a race: start_processes ends the others once one failed)
    assert re.search(rf"a process of the run \(pid \d+, mp.spawn's process (\d)\) raised ValueError: no config for rank "
                     rf"\1 before init_process_group at spawn_raise_before_init.py:{at}", text), text
    assert "the script starts its own ranks (mp.spawn), so --nproc-per-node does not apply" in text, text
    assert TORCHRUN_HINT not in text and "ProcessRaisedException" not in text, text


def test_a_script_that_crashes_on_import_is_not_told_to_give_nproc_per_node(script_zygote, tmp_path):
    """Run as-is, the script's own process raises on import (before it could start any rank):
    the line says so, with the error and the line, and no torchrun advice (the error is not a
    missing torchrun variable)."""
    script = tmp_path / "train.py"
    script.write_text("import torch.multiprocessing as mp\nimport simdist_no_such_module\n")
    run_id = new_run_id()
    with pytest.raises(ScriptError) as e:
        run_script(script, [], nproc_per_node=None, run_id=run_id, measure_compute=False, timeout_s=60,
                   zygote=script_zygote("sim"))
    assert tagged_processes(run_id) == []
    text = str(e.value)
    assert re.search(r"never initialised a process group: the script's own process \(pid \d+\) raised "
                     r"ModuleNotFoundError: No module named 'simdist_no_such_module' before init_process_group at "
                     r"train.py:2 \(exit codes \[1\]\); the error is the script's own", text), text
    assert TORCHRUN_HINT not in text, text
