"""Bad scenarios give one line naming the field and exit code 2; good ones round-trip."""

from __future__ import annotations

import pytest
import tomli_w

from simdist.errors import ScenarioError
from simdist.scenario import load_scenario, parse_scenario, scenario_to_dict

from .conftest import SCENARIOS, run_cli

GOOD = """
world_size = 2
[inputs]
counts = [1, 2]
[[loop]]
kind = "collective"
op = "all_reduce"
"""

# (scenario text, substring the one-line error must contain)
BAD = [
    ("world_size = 'two'\n[inputs]\ncounts=[1,1]\n", "world_size"),
    ("world_size = 0\n[inputs]\ncounts=[]\n", "world_size"),
    ("world_size = 2\ncolour = 'red'\n[inputs]\ncounts=[1,1]\n", "colour: unknown key"),
    ("world_size = 2\n[inputs]\ncounts=[1,1,1]\n", "inputs.counts"),
    ("world_size = 2\n[inputs]\ncounts=[1,-1]\n", "inputs.counts"),
    ("world_size = 2\n[inputs]\n", "inputs"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[groups]]\nname='g'\nranks=[0,5]\n", "groups[0].ranks"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='collective'\nop='all_reduce'\ngroup='evens'\n",
     "loop[0].group: unknown group 'evens'"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='collective'\nop='all_reduce'\nranks=[3]\n",
     "loop[0].ranks"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='teleport'\n", "loop[0]"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='forward'\n", "loop[0].kind"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[join]\njoinables=['ddp']\n", "join.joinables[0]"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='collective'\nop='broadcast'\nroot=7\n", "loop[0].root"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='p2p'\nsrc=0\ndst=0\n", "loop[0].dst"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='collective'\nop='all_reduce'\nnumel='many'\n",
     "loop[0].numel"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[expect]\ninputs_processed=[1]\n", "expect.inputs_processed"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[topology]\npreset='loopback'\n[[topology.nodes]]\nname='a'\n",
     "topology"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[[loop]]\nkind='collective'\nop='all_reduce'\nreduce_op='band'\n",
     "loop[0].reduce_op"),
    ("world_size = 2\n[inputs\ncounts=[1,1]\n", "not valid TOML"),
    ("world_size = 2\n[inputs]\ncounts=[1,1]\n[model]\nparams=[4]\nunused_params=[3]\n", "model"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_scenario_is_one_line_naming_the_field(tmp_scenario, text, needle):
    p = tmp_scenario(text)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    msg = str(ei.value)
    assert "\n" not in msg
    assert needle in msg, msg


def test_cli_bad_input_exits_2_without_traceback(tmp_scenario):
    p = tmp_scenario(BAD[7][0])
    res = run_cli("run", str(p))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "loop[0].group" in lines[0], res.stderr


def test_cli_missing_file_exits_2(tmp_path):
    res = run_cli("run", str(tmp_path / "nope.toml"))
    assert res.returncode == 2
    assert "cannot read" in res.stderr and "Traceback" not in res.stderr


def test_base_offset_inputs():
    s = parse_scenario({"world_size": 4, "inputs": {"base": 3, "offset": 1}})
    assert s.counts() == [3, 4, 5, 6]


def test_good_scenario_round_trips_through_toml(tmp_scenario):
    s = load_scenario(tmp_scenario(GOOD))
    again = parse_scenario(scenario_to_dict(s))
    assert again == s
    assert tomli_w.dumps(scenario_to_dict(s))


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_bundled_scenario_validates_and_round_trips(path):
    s = load_scenario(path)
    assert parse_scenario(scenario_to_dict(s)) == s
