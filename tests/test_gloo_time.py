"""The Gloo model of `simdist.network.gloo_time` (no real processes): Gloo's message programs
move the bytes and messages docs/timing.md says, take their closed-form time when every
busy thread has a core, and stretch as derived there when ranks outnumber cores."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simdist.collectives.gloo import allgather, alltoall, broadcast, ring_allreduce, ring_segments
from simdist.network.cost import CostModel
from simdist.network.gloo_time import GLOO_TIMED_OPS, HostRun, gloo_op_time, rank_program, turn_time
from simdist.network.host import HostProfile
from simdist.network.profile import Profile, load_profile

ALPHA, BETA, CALL = 50e-6, 1e-9, 30e-6
SIZES = [0, 1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 28]  # from 0 B: the latency is exactly alpha


def host(cores: int = 64, alpha: float = ALPHA, beta: float = BETA, call: float = CALL, two: float = 1.0,
         gamma: float = 0.0, copy: float = 0.0) -> HostProfile:
    """Affine messages alpha + n*beta; two in flight take `two` times as long on `cores`."""
    one = [alpha + n * beta for n in SIZES]
    return HostProfile(cores, call, SIZES, one, list(one), [t * two for t in one], gamma, copy)


def sends(prog) -> list[int]:
    return [st[5] for st in prog.steps if st[0] == "send"]


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("nbytes", [4096, 3 << 20, 40 << 20])
def test_ring_allreduce_moves_its_segments(p, nbytes):
    num, seg = ring_segments(nbytes, p)
    assert num == max(math.ceil(nbytes / (1 << 20)), 2 * p) + (-max(math.ceil(nbytes / (1 << 20)), 2 * p)) % p
    for r in range(p):
        s = sends(ring_allreduce(r, p, nbytes // 4, 4))
        assert len(s) == 2 * (num - num // p)  # reduce-scatter + all-gather
        assert sum(s) == pytest.approx(2 * (p - 1) / p * nbytes, rel=0.02)  # the ring's 2(p-1)/p n


@pytest.mark.parametrize("p", [2, 3, 4, 7])
def test_allgather_broadcast_alltoall_messages(p):
    n = 12 * 1024
    for r in range(p):
        ag = sends(allgather(r, p, n))
        assert len(ag) == 2 * (p - 1) and sum(ag) == (p - 1) * n  # 2(p-1) halves to rank + 1
        a2a = sends(alltoall(r, p, n))
        assert len(a2a) == p - 1 and set(a2a) == {n // p}
    bc = [sends(broadcast(r, p, n, 0)) for r in range(p)]
    assert sum(len(s) for s in bc) == p - 1 and all(x == n for s in bc for x in s)  # a binomial tree
    assert len(bc[0]) == math.ceil(math.log2(p))


def phase(m: int, b: float, a: float = ALPHA) -> float:
    """docs/timing.md: m messages of b seconds of bytes each, one at a time on a pair's
    socket, two in flight: the receive is announced a latency after it is posted, and a
    message is delivered a latency after its bytes; the pair alternates between waiting for
    the announcement (latency-bound, 2a + b per two messages) and back-to-back bytes. When
    b < a the phase's last message reaches its receiver while the wake-up for the one
    before runs, which delivers it too: the last b is not paid."""
    j = (m + 1) // 2 - 1
    return 2 * a + (m - 2 * j) * b + j * max(2 * a + b, 2 * b) - (b if m % 2 == 0 and b < a else 0.0)


def closed_form(op: str, n: int, p: int, beta: float) -> float:
    """docs/timing.md: one call with a core for every busy thread, no reduction or copy cost."""
    if op in ("all_reduce", "reduce_scatter"):  # reduce-scatter phase, then all-gather phase
        num, seg = ring_segments(n, p)
        return CALL + 2 * phase(num - num // p, seg * beta)
    if op == "all_gather":  # 2(p-1) halves
        return CALL + phase(2 * (p - 1), n / 2 * beta)
    if op == "broadcast":  # the root posts its sends at once: the deepest chain, floor(lg p) hops
        return CALL + ALPHA + (p.bit_length() - 1) * (ALPHA + n * beta)
    return CALL + 2 * ALPHA + n // p * beta  # all_to_all: every message at once


@pytest.mark.parametrize("op", sorted(GLOO_TIMED_OPS))
@pytest.mark.parametrize("p", [2, 3, 4, 6])
@pytest.mark.parametrize("n", [1 << 12, 3 << 20, 24 << 20])
@pytest.mark.parametrize("beta", [BETA, 1e-12])  # bandwidth-bound and latency-bound
def test_uncontended_time_is_the_closed_form(op, p, n, beta):
    n -= n % (4 * p)
    h = host(beta=beta)
    assert gloo_op_time(h, op, n, p, iterations=1) == pytest.approx(closed_form(op, n, p, beta), rel=1e-9)


def test_message_bytes_cost_per_end():
    """docs/timing.md: a message's bytes cost per byte the mean of what a message of each
    end's buffer costs (sender's read, receiver's write). Cheap bytes up to 2 MiB (in
    cache), dearer above: the ring all_reduce of a 24 MiB tensor sends 1 MiB segments out
    of the tensor; in the reduce-scatter phase they land in the 2-segment scratch (one end
    cheap), in the all-gather phase in the tensor (both ends dear). Broadcast and
    all_to_all move tensor to tensor."""
    cheap, dear = 1e-10, 4e-10
    sizes = [0, 1 << 12, 1 << 20, 2 << 20, 16 << 20, 256 << 20]
    one = [ALPHA + n * (cheap if n <= 2 << 20 else dear) for n in sizes]
    h = HostProfile(64, CALL, sizes, one, list(one), list(one), 0.0, 0.0)
    n, p = 24 << 20, 2
    num, seg = ring_segments(n, p)
    assert (num, seg) == (24, 1 << 20)
    m = num - num // p
    assert gloo_op_time(h, "all_reduce", n, p, iterations=1) == pytest.approx(
        CALL + phase(m, seg * (cheap + dear) / 2) + phase(m, seg * dear), rel=1e-9)
    assert gloo_op_time(h, "broadcast", n, p, iterations=1) == pytest.approx(CALL + 2 * ALPHA + n * dear, rel=1e-9)
    small = 1 << 20  # all in cache: both phases cheap
    num, seg = ring_segments(small, p)
    assert gloo_op_time(h, "all_reduce", small, p, iterations=1) == pytest.approx(
        CALL + 2 * phase(num - num // p, seg * cheap), rel=1e-9)


@pytest.mark.parametrize("two", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("p", [3, 4])
def test_more_ranks_than_cores_stretch_as_derived(two, p):
    """No latency, no call: the ring's p pairs move bytes at once, each message wanting
    e = cores*two/2 cores, so with e*p > cores everything runs cores/(e*p) as fast; all_to_all
    has p(p-1) messages at once."""
    n = 12 << 20  # 12 segments of 1 MiB at p = 3 and 4: every message the same size
    free = host(cores=64, call=0.0, alpha=0.0)
    tight = host(cores=2, call=0.0, two=two, alpha=0.0)
    e = tight.demand(1 << 20)
    assert e == pytest.approx(max(1.0, two))
    for op, busy in (("all_reduce", p), ("all_to_all", p * (p - 1))):
        got = gloo_op_time(tight, op, n, p, iterations=1)
        assert got == pytest.approx(gloo_op_time(free, op, n, p, iterations=1) * max(1.0, e * busy / 2), rel=1e-9)


@pytest.mark.parametrize("cores", [2, 3, 4])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_deliveries_share_cores(cores, p):
    """Latency only: all_to_all's p(p-1) messages reach their receivers together after the
    announcements (a wait, no core). While every rank has a core (p <= cores) one wake-up
    per rank delivers all p - 1 of its messages, whichever ranks sent them: 2 alpha, also
    where the messages outnumber the cores (p = 3 on 3 or 4 cores, p = 4 on 4). With more
    ranks than cores each message is a turn of alpha (no ring step measured) and the
    p(p-1) turns share the cores: alpha + alpha*p(p-1)/cores."""
    h = host(cores=cores, call=0.0, beta=0.0)
    want = 2 * ALPHA if p <= cores else ALPHA + ALPHA * p * (p - 1) / cores
    assert gloo_op_time(h, "all_to_all", 4096, p, iterations=1) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 64])
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6])
def test_latency_bound_ring_takes_turns_as_derived(cores, p):
    """docs/timing.md, small sizes: a ring phase of 2(p - 1) messages per pair goes in p - 1
    rounds of two in flight; a round is the notice (a wait, no core) and then the wake-ups.
    While every rank has a core (p <= cores) one wake-up of alpha delivers both of a rank's
    messages: 2 alpha a round. With more ranks than cores every message is a turn of its own
    and the 2p turns share the cores; without a measured ring step a turn is alpha:
    alpha + alpha*2p/cores. all_gather is one phase, all_reduce (2p segments below 2p MiB) two."""
    h = host(cores=cores, call=0.0, beta=0.0)
    n = 4096 * p
    per_round = 2 * ALPHA if p <= cores else ALPHA + ALPHA * 2 * p / cores
    assert gloo_op_time(h, "all_gather", n, p, iterations=1) == pytest.approx((p - 1) * per_round, rel=1e-9)
    assert gloo_op_time(h, "all_reduce", n, p, iterations=1) == pytest.approx(2 * (p - 1) * per_round, rel=1e-9)


RING = {"3": 200e-6, "4": 320e-6}  # a measured p2p ring step at 3 and 4 ranks on 2 cores


def ring_step(h: HostProfile, p: int, steps: int = 5) -> float:
    """The calibration's ring step run on the model: each rank posts a receive from the
    previous and a send of the smallest message to the next, waits for both, again."""
    def one(r: int) -> list[tuple]:
        return [("recv", "out", (r - 1) % p, "p2p", 0, 0), ("send", "out", (r + 1) % p, "p2p", 0, 0),
                ("wait_recv", "out"), ("wait_send", "out"), ("mark",)]

    progs = [one(r) * steps for r in range(p)]
    marks = HostRun(h, progs).run()
    return (max(m[-1] for m in marks) - max(m[0] for m in marks)) / (steps - 1)


@pytest.mark.parametrize("p", [3, 4])
def test_ring_step_calibrates_the_turn_and_the_model_reproduces_it(p):
    """docs/timing.md, ranks taking turns: the model runs the measured ring step as a notice
    and p turns on the cores, R(p) = alpha + p*turn/cores, so turn = (R(p) - alpha)*cores/p;
    run on the model, the ring step then takes exactly the measured R(p)."""
    h = dataclasses.replace(host(cores=2, call=0.0, beta=0.0), ring_s=dict(RING))
    turn = (RING[str(p)] - ALPHA) * 2 / p
    assert turn_time(h, p) == pytest.approx(turn, rel=1e-12)
    assert ring_step(h, p) == pytest.approx(RING[str(p)], rel=1e-9)
    assert turn_time(h, 2) == ALPHA and turn_time(host(cores=2), p) == ALPHA  # a core each; nothing measured


@pytest.mark.parametrize("p", [3, 4, 5, 6])
def test_more_ranks_than_cores_take_turns_priced_from_the_ring_step(p):
    """docs/timing.md: with more ranks than cores a round of the ring (two in flight, each
    message its own turn) is the notice and 2p turns on the cores, alpha + 2p*turn/cores =
    2R(p) - alpha: two measured ring steps less one notice. all_gather = (p - 1) rounds,
    all_reduce = 2(p - 1), all_to_all the notice and p(p - 1) turns. Above the largest
    measured world size the turn stays the largest one's, so the time still grows as p/cores."""
    h = dataclasses.replace(host(cores=2, call=0.0, beta=0.0), ring_s=dict(RING))
    turn = (RING[str(min(p, 4))] - ALPHA) * 2 / min(p, 4)
    assert turn_time(h, p) == pytest.approx(turn, rel=1e-12)
    per_round = ALPHA + 2 * p * turn / 2
    if p <= 4:
        assert per_round == pytest.approx(2 * RING[str(p)] - ALPHA, rel=1e-12)
    n = 4096 * p
    assert gloo_op_time(h, "all_gather", n, p, iterations=1) == pytest.approx((p - 1) * per_round, rel=1e-9)
    assert gloo_op_time(h, "all_reduce", n, p, iterations=1) == pytest.approx(2 * (p - 1) * per_round, rel=1e-9)
    assert gloo_op_time(h, "all_to_all", n, p, iterations=1) == pytest.approx(ALPHA + turn * p * (p - 1) / 2, rel=1e-9)
    assert ring_step(h, p) == pytest.approx(ALPHA + p * turn / 2, rel=1e-9)


def test_a_turn_is_never_shorter_than_a_wake_up_and_fills_gaps_linearly():
    """A ring step measured faster than the model's notice and wake-ups (R < alpha(1 + p/C))
    gives turns of alpha (the model without turns); a world size between measured ones is
    interpolated linearly in p from (cores, alpha)."""
    fast = dataclasses.replace(host(cores=2), ring_s={"3": ALPHA})
    assert turn_time(fast, 3) == ALPHA and turn_time(fast, 4) == ALPHA
    gap = dataclasses.replace(host(cores=2), ring_s={"4": 320e-6})
    assert turn_time(gap, 3) == pytest.approx((ALPHA + (320e-6 - ALPHA) / 2) / 2, rel=1e-12)


def test_two_ranks_on_two_cores_exchange_as_measured():
    """At p = 2 the ring exchanges in both directions at once: each message's bytes then take
    the measured two-in-flight time (the model reproduces its own calibration point)."""
    h = host(cores=2, call=0.0, two=1.7, alpha=0.0)
    n = 8 << 20  # 8 segments of 1 MiB, 8 messages each way
    num, seg = ring_segments(n, 2)
    assert gloo_op_time(h, "all_reduce", n, 2, iterations=1) == pytest.approx(
        2 * (num - num // 2) * 1.7 * seg * BETA, rel=1e-9)


def test_back_to_back_calls_keep_the_period():
    """A benchmark's batch mean is the period of calls back to back: for the ring it is one
    call's time (every rank drains its messages before returning)."""
    h = host()
    for op in ("all_reduce", "all_gather"):
        assert gloo_op_time(h, op, 1 << 20, 3) == pytest.approx(gloo_op_time(h, op, 1 << 20, 3, iterations=1))


def test_reduction_and_copies_cost_cpu():
    base = gloo_op_time(host(), "reduce_scatter", 1 << 20, 2, iterations=1)
    assert gloo_op_time(host(copy=1e-9), "reduce_scatter", 1 << 20, 2, iterations=1) > base
    assert gloo_op_time(host(gamma=1e-9), "all_reduce", 1 << 20, 2, iterations=1) > base - 1e-12


def test_unmatched_programs_are_reported():
    progs = [[("send", "out", 1, "x", 0, 8), ("wait_send", "out")], [("mark",)]]
    with pytest.raises(RuntimeError, match="never finished"):
        HostRun(host(), progs).run()
    with pytest.raises(ValueError, match="op:"):
        rank_program("gather", 0, 2, 8, host())


def test_profile_round_trip_and_cost_model(tmp_path):
    h = host(cores=2, two=1.5, gamma=3e-10, copy=2e-10)
    path = Profile(host=h).save(tmp_path / "host.json")
    prof = load_profile(path)
    assert prof.host == h
    cm = CostModel.from_params(4, 0.0, 0.0, 0.0, profile=prof)
    assert cm.collective_time("all_gather", 1 << 20, [0, 1, 2, 3]) == gloo_op_time(h, "all_gather", 1 << 20, 4)
    assert prof.predict("barrier", 0, 4) is None  # not timed by the Gloo model
    bad = path.read_text().replace('"cores": 2', '"cores": 0')
    (tmp_path / "bad.json").write_text(bad)
    with pytest.raises(Exception, match="topology.profile"):
        load_profile(tmp_path / "bad.json")


def test_calibrate_refuses_an_unwritable_out_before_measuring(tmp_path):
    from typer.testing import CliRunner

    from simdist.cli.timing import app

    r = CliRunner().invoke(app, ["calibrate", "--out", str(tmp_path / "missing" / "host.json")])
    assert r.exit_code == 2 and r.output.startswith("error: out:") and "Traceback" not in r.output
