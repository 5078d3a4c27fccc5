"""`CUDA_VISIBLE_DEVICES` on the simulated GPUs (`simdist.script.rank.visible_gpus`), and their
events' timing (`simdist.script.rank.gpu_streams`).

rasbt/LLMs-from-scratch's `DDP-script.py` spawns one rank per `torch.cuda.device_count()` and
says to run it as `CUDA_VISIBLE_DEVICES=0,1 python DDP-script.py`: simdist's 8 simulated GPUs
ignored the variable, so it spawned 8 ranks whatever the user said (and every rank failed on its
5 samples). The reading is torch's own (`torch.cuda._parse_visible_devices` and the NVML count's
trimming), checked here case by case; then the same program on simulated ranks and on real
Gloo, both with the simulated GPUs, must agree, and each must be what a GPU machine does.
"""

from __future__ import annotations

import pytest

from simdist.errors import ScriptError
from simdist.script.api import run_script
from simdist.script.rank import gpu_props, visible_gpus
from tests.conftest import ROOT
from tests.test_script_examples import _verdict, differences
from tests.test_third_party_scripts import _both

SCRIPT = ROOT / "tests" / "scripts" / "visible_gpus.py"


@pytest.mark.parametrize("value,seen", [
    (None, list(range(8))), ("0,1", [0, 1]), ("3,5", [3, 5]), (" 2 , 0", [2, 0]),
    ("0,1,9,2", [0, 1]),  # the list ends at the first GPU the node lacks
    ("1,-1,2", [1]),  # and at a negative one
    ("1,1", []), ("", []),  # a repeated ordinal, or nothing, leaves no GPU
    ("1gpu,2ampere", [1, 2]),  # strtoul's reading: the digits an entry starts with
    ("MIG-abc", []),  # the simulated A100s have MIG off
])
def test_the_visible_gpus_are_read_as_torch_reads_the_variable(value, seen, monkeypatch):
    visible_gpus.install(8)
    if value is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpus.ordinals() == seen and visible_gpus.count() == len(seen)


def test_uuids_name_the_simulated_gpus_and_the_count_is_kept_once_cuda_is_initialised(monkeypatch):
    """`GPU-<uuid prefix>` entries pick the simulated GPUs by their UUIDs (an ambiguous prefix
    ends the list); once CUDA is initialised the count no longer follows the variable."""
    visible_gpus.install(8)
    six, two = (str(gpu_props.of(i).uuid) for i in (6, 2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"GPU-{six[:8]},GPU-{two}")
    assert visible_gpus.ordinals() == [6, 2] and visible_gpus.physical(1) == 2
    visible_gpus.fix()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert visible_gpus.count() == 2
    visible_gpus.unfix()
    assert visible_gpus.count() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-,GPU-0")  # "GPU-" prefixes every UUID: ambiguous
    assert visible_gpus.count() == 0


@pytest.mark.parametrize("value,note", [
    (None, None), ("0,1,2,3", None), ("3,2,1,0,7", None),  # unset, or every simulated GPU seen: nothing to say
    ("0", "CUDA_VISIBLE_DEVICES='0' (the run's environment) leaves each process 1 of the simulated node's 4 GPUs "
          "(torch.cuda.device_count() 1), as on a GPU node: unset it to see all 4"),
    ("", "CUDA_VISIBLE_DEVICES='' (the run's environment) leaves each process 0 of the simulated node's 4 GPUs "
         "(torch.cuda.device_count() 0), as on a GPU node: unset it to see all 4"),
])
def test_an_exported_variable_that_hides_simulated_gpus_is_said(value, note, monkeypatch):
    """A `CUDA_VISIBLE_DEVICES` left exported in the user's shell (a GPU box's, a scheduler's
    job's, or "" to hide GPUs) reaches every rank, and a script that sizes its world by
    `device_count()` (mp.spawn) runs fewer ranks than the simulated node has GPUs, or none:
    faithful to a GPU node, but the report said nothing of it (`simdist run vis.py
    --gpus-per-node 4` with CUDA_VISIBLE_DEVICES=0 ran 1 rank; with "" it ended in "never
    initialised a process group" and no reason). The run's report notes it (`api.execute`)."""
    if value is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpus.hidden_note(4) == note
    assert visible_gpus.hidden_note(0) is None  # a CPU-only node has nothing to hide


def test_a_world_the_variable_sized_says_so(tmp_path, monkeypatch):
    """A script that spawns one rank a GPU it sees (tests/scripts/spawn_per_gpu.py) on the
    simulated 4-GPU node: 1 rank under an exported CUDA_VISIBLE_DEVICES=0, which its report
    notes; none under "", and the one-line error says why."""
    script = ROOT / "tests" / "scripts" / "spawn_per_gpu.py"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    report = run_script(script, gpus=4, timeout_s=120, measure_compute=False)
    assert [r.output for r in report.ranks] == [["[0] of 1: count 1"]]
    assert visible_gpus.hidden_note(4) in report.notes
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ScriptError) as e:
        run_script(script, gpus=4, timeout_s=120, measure_compute=False)
    assert str(e.value).endswith("; " + visible_gpus.hidden_note(4))


@pytest.mark.real
def test_two_visible_gpus_renumbered_from_zero_agree_with_real_gloo(script_zygote, tmp_path, monkeypatch):
    """`CUDA_VISIBLE_DEVICES=3,5`: each rank sees 2 GPUs, its `cuda:{local_rank}` is the node's
    GPU 3 or 5 (their UUIDs), and the all-reduce runs on them; as on real Gloo."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    sim, real = _both(SCRIPT, 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    for r, node_gpu in ((0, 3), (1, 5)):
        assert sim.ranks[r].output == [f"[{r}] visible '3,5': count 2, available True",
                                       f"[{r}] uuid {gpu_props.of(node_gpu).uuid}", f"[{r}] sum [3.0, 3.0] on cuda:{r}"]


@pytest.mark.real
def test_a_rank_whose_gpu_is_not_visible_fails_in_set_device(script_zygote, tmp_path, monkeypatch):
    """`CUDA_VISIBLE_DEVICES=0` with 2 ranks: rank 1's `set_device(1)` is CUDA's "invalid device
    ordinal" (torch.AcceleratorError), and rank 0's all-reduce loses its peer; before, rank 1
    used a GPU the process could not see and the run completed."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    sim, real = _both(SCRIPT, 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["error:peer_lost", "error:other"]
    assert differences(sim, real) == []
    err = sim.ranks[1].error
    assert err.type == "AcceleratorError" and err.message.startswith("CUDA error: invalid device ordinal\n")
    assert [n for n in sim.notes if n.startswith("CUDA_VISIBLE_DEVICES='0'")] == [visible_gpus.hidden_note(8)]


@pytest.mark.real
def test_no_visible_gpu_takes_the_cpu_path(script_zygote, tmp_path, monkeypatch):
    """`CUDA_VISIBLE_DEVICES=""`: no GPU (`is_available()` False, `device_count()` 0), the
    script takes its CPU path, and `.cuda()` raises torch's "No CUDA GPUs are available"."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sim, real = _both(SCRIPT, 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert sim.ranks[0].output == ["[0] visible '': count 0, available False",
                                   "[0] RuntimeError: No CUDA GPUs are available", "[0] sum [3.0, 3.0] on cpu"]


@pytest.mark.real
def test_an_eight_gpu_node_has_no_ninth_gpu(script_zygote, tmp_path):
    """No variable, 8 GPUs: `cuda:8` is CUDA's "invalid device ordinal" too (a tensor placed
    there, as `set_device(8)`), where before it was a ninth simulated GPU."""
    script = tmp_path / "ninth.py"
    script.write_text("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "x = torch.ones(1, device=f'cuda:{7 + dist.get_rank()}')\ndist.all_reduce(x)\n")
    sim, real = _both(script, 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["error:peer_lost", "error:other"]
    assert differences(sim, real) == []
    assert sim.ranks[1].error.type == "AcceleratorError"


@pytest.mark.real
def test_cuda_events_time_the_step_between_their_records(script_zygote, tmp_path):
    """`torch.cuda.Event(enable_timing=True)`: `elapsed_time` is the milliseconds between the
    two records (it was always 0.0, so tokens a second were 0, or a ZeroDivisionError where a
    GPU's run goes on); torch's ValueErrors for an event without timing or not recorded."""
    sim, real = _both(ROOT / "tests" / "scripts" / "cuda_events.py", 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert sim.ranks[1].output == ["[1] step of at least 50 ms: True, tokens a second True",
                                   "[1] Both events must be created with argument 'enable_timing=True'.",
                                   "[1] Both events must be recorded before calculating elapsed time.",
                                   "[1] recorded on the stream: True, Event"]
