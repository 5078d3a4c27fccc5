"""Schedules compute the right values, move the bytes their formulas say, and take the
time their closed forms say."""

from __future__ import annotations

import numpy as np
import pytest

from simdist.collectives import REGISTRY, algorithms_for, gloo, make_schedule, resolve, run_values, schedule_time
from simdist.collectives.execute import expected_outputs, knowledge, run_times
from simdist.errors import ScenarioError
from simdist.vocab import ROOTED_OPS

ALL = sorted(REGISTRY)
PS = range(2, 10)
ALPHA, BETA, GAMMA = 7e-6, 1.3e-9, 0.4e-9


def _count(op: str, p: int) -> int:
    """A per-rank unit count divisible by p and by every power of two <= p."""
    if op == "barrier":
        return 0
    return 2 * 8 * 9 * 5 * 7 if op not in ("all_gather", "gather") else 6


def _roots(op: str, p: int) -> list[int]:
    return [0, p - 1, p // 2] if op in ROOTED_OPS else [0]


def _inputs(p: int, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, count).astype(np.float64) for _ in range(p)]


@pytest.mark.parametrize("op,algo", ALL)
def test_values_correct_for_every_world_size(op, algo):
    """Executing the schedule on numpy arrays gives the collective's result (p = 2..9)."""
    for p in PS:
        for root in _roots(op, p):
            count = _count(op, p)
            s = make_schedule(op, algo, p, count, root)
            xs = _inputs(p, count, p * 31 + root)
            bufs = run_values(s, xs)
            exp = expected_outputs(s, xs)
            if op != "barrier":
                assert exp, (op, algo, p)
            for r, (sl, want) in exp.items():
                np.testing.assert_array_equal(bufs[r][sl], want, err_msg=f"{op}/{algo} p={p} root={root} rank={r}")
            if op == "barrier":
                assert all(k == set(range(p)) for k in knowledge(s)), (algo, p)


@pytest.mark.parametrize("algo", algorithms_for("all_reduce"))
@pytest.mark.parametrize("count", [1, 5, 37, 1000])
def test_all_reduce_uneven_counts(algo, count):
    for p in PS:
        s = make_schedule("all_reduce", algo, p, count)
        xs = _inputs(p, count, count + p)
        bufs = run_values(s, xs)
        for r in range(p):
            np.testing.assert_array_equal(bufs[r], np.sum(xs, axis=0))


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_gather_scatter_uneven(op):
    for algo in algorithms_for(op):
        for p in PS:
            count = 3 if op == "all_gather" else 4 * p + 3
            s = make_schedule(op, algo, p, count)
            xs = _inputs(p, count, p)
            bufs = run_values(s, xs)
            for r, (sl, want) in expected_outputs(s, xs).items():
                np.testing.assert_array_equal(bufs[r][sl], want)


@pytest.mark.parametrize("op,algo", ALL)
def test_bytes_moved_match_formula(op, algo):
    a = REGISTRY[(op, algo)]
    for p in range(1, 10):
        for root in _roots(op, p):
            count = _count(op, p)
            s = make_schedule(op, algo, p, count, root)
            assert s.units_sent == a.units(p, count), (op, algo, p, root)


def test_bytes_textbook_values():
    # ring all_reduce: every rank sends 2(p-1)/p of its buffer
    s = make_schedule("all_reduce", "ring", 4, 4000)
    assert s.units_sent == 4 * 2 * 3 * 1000
    assert all(t.count == 1000 for st in s.steps for t in st)
    # recursive doubling all_gather on 8 ranks: lg 8 = 3 steps, p(p-1) blocks in total
    s = make_schedule("all_gather", "recursive_doubling", 8, 10)
    assert len(s.steps) == 3 and s.units_sent == 8 * 7 * 10
    # binomial broadcast: ceil(lg 5) = 3 steps, p-1 messages of the whole buffer
    s = make_schedule("broadcast", "tree", 5, 100, root=2)
    assert len(s.steps) == 3 and s.messages == 4


@pytest.mark.parametrize("op,algo", ALL)
def test_closed_form_equals_step_level(op, algo):
    """No-contention step-level time equals the closed form, for p = 1..9."""
    a = REGISTRY[(op, algo)]
    for p in range(1, 10):
        for root in _roots(op, p):
            count = _count(op, p)
            s = make_schedule(op, algo, p, count, root)
            t = schedule_time(s, lambda i, j: (ALPHA, BETA), GAMMA)
            cf = a.time(p, count, ALPHA, BETA, GAMMA)
            assert t == pytest.approx(cf, rel=1e-12, abs=1e-15), (op, algo, p, root)


def test_textbook_coefficients():
    ring = REGISTRY[("all_reduce", "ring")].coeffs(8)
    assert ring == pytest.approx((14, 2 * 7 / 8, 7 / 8))
    rab = REGISTRY[("all_reduce", "rabenseifner")].coeffs(8)
    assert rab == pytest.approx((6, 2 * 7 / 8, 7 / 8))
    rd = REGISTRY[("all_reduce", "recursive_doubling")].coeffs(8)
    assert rd == pytest.approx((3, 3, 3))
    assert REGISTRY[("broadcast", "tree")].coeffs(5) == pytest.approx((3, 3, 0))
    assert REGISTRY[("barrier", "dissemination")].coeffs(9) == pytest.approx((4, 0, 0))
    # non powers of two fold: 2 extra steps
    assert REGISTRY[("all_reduce", "recursive_doubling")].coeffs(6) == pytest.approx((4, 4, 3))


def test_run_times_records_each_transfer():
    s = make_schedule("all_reduce", "ring", 3, 300)
    fin, log = run_times(s, lambda i, j: (1.0, 0.0), 0.0, record=True)
    assert len(log) == s.messages == 12
    assert max(fin) == pytest.approx(4.0)


def test_resolve_and_errors():
    assert resolve("all_reduce", "auto") is None
    assert resolve("all_reduce", "binomial") == "tree"
    assert resolve("all_reduce", "Halving-Doubling") == "rabenseifner"
    with pytest.raises(ScenarioError, match=r"^algo: unknown algorithm 'nope' for all_reduce \(choose from auto, ring"):
        resolve("all_reduce", "nope")
    with pytest.raises(ScenarioError, match="unknown collective 'allreduce'"):
        resolve("allreduce", "ring")
    with pytest.raises(ScenarioError, match="root: rank 5 out of range"):
        make_schedule("broadcast", "tree", 4, 10, root=5)


def test_every_op_has_algorithms():
    for op in (
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "barrier",
        "gather",
        "scatter",
    ):
        assert algorithms_for(op)


def test_gloo_ring_segments_follow_allreduce_cc():
    MB = 1 << 20
    # numSegments = roundUp(max(ceil(n / 1 MiB), 2p), p); segmentBytes = ceil(n / numSegments)
    assert gloo.ring_segments(MB, 2) == (4, MB // 4)
    assert gloo.ring_segments(4 * MB, 2) == (4, MB)
    assert gloo.ring_segments(64 * MB, 2) == (64, MB)
    assert gloo.ring_segments(64 * MB, 4) == (64, MB)
    assert gloo.ring_segments(5 * MB, 4) == (8, 5 * MB // 8)
    assert gloo.ring_messages(MB, 2) == 2 * (4 - 2)
    assert gloo.segment_thresholds(2) == [4 * MB]


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("nbytes", [1 << 20, (5 << 20) + 12, 64 << 20])
def test_gloo_ring_program_sends_what_the_segment_arithmetic_says(p, nbytes):
    """The message programs (Gloo rules) and the segment count (calibration) are one model."""
    num, seg = gloo.ring_segments(nbytes, p)
    for rank in range(p):
        prog = gloo.ring_allreduce(rank, p, nbytes // 4, 4)
        sends = [s for s in prog.steps if s[0] == "send"]
        assert len(sends) == gloo.ring_messages(nbytes, p)
        assert max(s[5] for s in sends) == seg and prog.tmp_bytes == 2 * seg
        assert {s[2] for s in sends} == {(rank - 1) % p}


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("nbytes", [4, 36, 1 << 20, (5 << 20) + 12])
def test_gloo_ring_reduce_program_follows_reduce_cc(p, nbytes):
    """gloo/reduce.cc: the all_reduce's ring reduce-scatter with reduce.cc's segments (to
    rank - 1, from rank + 1, at most a segment each, slot "reduce"), then each non-root sends
    its own block to the root, which receives every non-empty block in rank order."""
    num, seg = gloo.reduce_segments(nbytes, p)
    block = num // p * seg

    def own(r):
        return r * block, max(0, min(block, nbytes - r * block))

    for root in (0, p - 1):
        for rank in range(p):
            prog = gloo.message_program("reduce", rank, p, nbytes // 4, 4, root)
            posts = [s for s in prog.steps if s[0] in ("send", "recv")]
            assert len(posts) <= gloo.message_count("reduce", p, nbytes // 4, 4)
            assert {s[3] for s in posts} == {"reduce"} and prog.tmp_bytes == 2 * seg
            if rank == root:
                blocks = [r for r in range(p) if r != root and own(r)[1]]
                tail = posts[len(posts) - len(blocks):]
                assert [(s[0], s[1], s[2], s[4], s[5]) for s in tail] == [("recv", "out", r, *own(r)) for r in blocks]
                assert prog.steps[len(prog.steps) - len(blocks):] == [("wait_recv", "out")] * len(blocks)
            else:
                tail = [posts[-1]] if own(rank)[1] else []
                assert [(s[0], s[2], s[4], s[5]) for s in tail] == ([("send", root, *own(rank))] if tail else [])
            ring = posts[:len(posts) - len(tail)]
            assert all(s[2] == ((rank - 1) % p if s[0] == "send" else (rank + 1) % p) for s in ring)
            assert all(0 < s[5] <= seg for s in ring)
            # the reduce-scatter is the all_reduce's first half, on reduce.cc's segments
            assert sum(s[0] == "send" for s in ring) <= gloo.ring_messages(nbytes, p)
