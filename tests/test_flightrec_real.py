"""Flight Recorder dumps of real Gloo runs: recorded live the way torch leaves them, and the
dumps' replays run on real Gloo.

* A live recording: the ranks run with TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE and
  TORCHELASTIC_ERROR_FILE (`simdist.flightrec.format.fr_env`) and torch's control-plane socket;
  while the job hangs, each rank's dump is fetched on demand (``fr_trace_json``, JSON form),
  and when the watchdog ends it each rank writes torch's pickle where
  TORCH_FR_DUMP_TEMP_FILE says. `simdist diagnose` on either gives `simdist check`'s verdict.
* Every bundled failing scenario's recorded dumps (tests/data/flightrec, see
  bench/record_fr_dumps.py) replayed on Gloo: the same verdict, blocked operations and
  finding kinds as `simdist check` on the scenario.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from pathlib import Path

import pytest

from simdist.check.classify import check_run
from simdist.check.pairing import trace_mismatches
from simdist.flightrec.diagnose import diagnose
from simdist.flightrec.export import export_dumps, write_dumps
from simdist.flightrec.format import DEFAULT_DUMP_PREFIX, ON_DEMAND_HANDLER, dump_path
from simdist.scenario import load_scenario, parse_scenario

from .conftest import SCENARIOS
from .test_flightrec import DATA, FAILING, checked, fr_trace_text, verdict_of

torch = pytest.importorskip("torch")
from real_backend.launch import run_real  # noqa: E402

pytestmark = pytest.mark.real


class _UnixHTTP(http.client.HTTPConnection):
    """HTTP over a Unix socket (what ``curl --unix-socket`` does)."""

    def __init__(self, path: str):
        super().__init__("localhost", timeout=5)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.path)


def fetch_on_demand(sock: Path) -> bytes | None:
    """A rank's dump from torch's control plane: ``POST /handler/fr_trace_json`` (None: not up yet)."""
    try:
        conn = _UnixHTTP(str(sock))
        conn.request("POST", f"/handler/{ON_DEMAND_HANDLER}")
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return body if resp.status == 200 else None
    except OSError:
        return None


def test_live_recording_on_timeout_and_on_demand_diagnoses_as_check(tmp_path, real_zygote):
    """subset_collective: rank 0's barrier meets rank 1's all_reduce; both block at once."""
    import json

    s = load_scenario(SCENARIOS / "subset_collective.toml", "real")
    dumps, on_demand = tmp_path / "dumps", tmp_path / "on_demand"
    on_demand.mkdir()
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(report=run_real(s, fr_dumps=dumps, fr_on_demand=True,
                                                                             zygote=real_zygote)))
    runner.start()
    got: dict[int, bytes] = {}
    while runner.is_alive() and len(got) < s.world_size:
        for r in range(s.world_size):
            body = fetch_on_demand(dumps / f"rank{r}.sock") if r not in got else None
            if body and any(not e["retired"] for e in json.loads(body).get("entries", [])):
                got[r] = body  # blocked: its collective has not retired
        time.sleep(0.2)
    runner.join(timeout=300)
    assert not runner.is_alive() and result["report"].outcome == "hang"
    assert sorted(got) == [0, 1], "the ranks' control plane never showed them blocked"
    for r, body in got.items():
        Path(dump_path(str(on_demand / DEFAULT_DUMP_PREFIX), r) + ".json").write_bytes(body)
    expected = checked("subset_collective")
    on_timeout = diagnose([dumps])  # the pickles the ranks wrote where TORCH_FR_DUMP_TEMP_FILE said
    assert [d.form for d in on_timeout.dumps.dumps.values()] == ["pickle", "pickle"]
    assert verdict_of(on_timeout.job.report, on_timeout.verdict) == expected
    assert on_timeout.job.frames[0] and on_timeout.job.report.ranks[0].location is not None
    live = diagnose([on_demand])
    assert [d.form for d in live.dumps.dumps.values()] == ["json", "json"]
    assert verdict_of(live.job.report, live.verdict) == expected
    assert not live.job.frames.get(0)  # the JSON form has no frames
    # the real run exported for torch's analyzer (simdist export --real): it names the mismatch at #1
    write_dumps(export_dumps(result["report"], s), tmp_path / "exported")
    text = fr_trace_text(tmp_path / "exported")
    assert "Collective sequence number: 1 has errors" in text and "COLLECTIVE_TYPE_MISMATCH" in text


@pytest.mark.parametrize("name", FAILING)
def test_replay_of_recorded_dumps_on_gloo_gives_checks_verdict(name, real_zygote):
    d = diagnose([DATA / name])
    s = parse_scenario(d.replay, source=name, target="real")
    rep = run_real(s, timeout_s=5, zygote=real_zygote)
    rep.findings += trace_mismatches(rep, s)  # what the engine would name while pairing
    assert verdict_of(rep, check_run(rep, s)) == checked(name)
