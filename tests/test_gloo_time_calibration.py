"""How `simdist calibrate` turns its measurements into primitives (no real processes): the
spread over interleaved blocks, the call cost as a barrier less the same block's exchange,
several calibrations combined by the median, and the spreads that make a noisy calibration
visible (docs/timing.md, "What is measured")."""

from __future__ import annotations

import dataclasses

import pytest

from real_backend.calibrate import GRID, MESSAGE_SIZES, block_summary, call_cost, host_from_blocks, ring_worlds
from simdist.network.gloo_time import gloo_op_time
from simdist.network.host import HostProfile, median_host

SIZES = [256, 4096, 1 << 20]


def test_one_disturbed_block_moves_nothing_and_shows_in_the_spread():
    assert block_summary([1e-4] * 6 + [9e-4]) == (1e-4, 0.0)  # a burst of load hits one block
    med, spread = block_summary([1.0, 2.0, 3.0, 4.0, 5.0])
    assert med == 3.0 and spread == pytest.approx((4.0 - 2.0) / 3.0)
    assert block_summary([5e-5]) == (5e-5, 0.0)


def test_call_cost_pairs_barrier_and_exchange_block_by_block():
    call, exch = 40e-6, 150e-6
    slow = [1.0, 1.0, 3.0, 1.0, 2.5, 1.0, 1.0]  # the load slows both terms of a block alike
    barrier = [f * (exch + call) for f in slow]
    exchange = [f * exch for f in slow]
    got, spread = call_cost(barrier, exchange, [14e-6] * len(slow))
    assert got == pytest.approx(call)
    assert spread == pytest.approx(0.75)  # the slow blocks show: sorted 1, 1, 1, 1, 1, 2.5, 3 times the call
    # never below the hand-off to the worker thread (the one-rank all_reduce of that block)
    assert call_cost([150e-6] * 3, [150e-6] * 3, [14e-6, 15e-6, 13e-6])[0] == pytest.approx(14e-6)


def _rows(one, exch, barrier, floor, blocks=5):
    """What the workers emit (`_timed_passes`): per quantity the 25th percentile of all its
    calls and of each block's."""
    def q(v):
        return {"all": v, "blocks": [v] * blocks, "cpu": v / 2}

    rows = {f"p2p{n}": {"nbytes": n, "one_way_s": q(one(n)), "reverse_s": q(one(n)), "exchange_s": q(exch(n))}
            for n in SIZES}
    rows["call"] = {"call_s": q(floor), "barrier_s": q(barrier)}
    rows["local"] = {"gamma": 3e-11, "copy": 2e-11, "copy_s": {str(n): n * 2e-11 for n in SIZES},
                     "fresh_s": {str(n): n * 5e-11 for n in SIZES}}
    return rows


def test_host_from_blocks_keeps_the_low_quantile_monotone_times_and_the_paired_call():
    rows = _rows(lambda n: 80e-6 + n * 3e-10, lambda n: 170e-6 + n * 6e-10, 230e-6, 14e-6)
    rows["p2p256"]["one_way_s"]["blocks"][1:3] = [5e-3, 4e-3]  # two disturbed blocks of five: spread, not value
    rows["p2p4096"]["reverse_s"]["all"] = 2e-3  # slower than 1 MiB: load, not the machine
    rows["call"]["barrier_s"]["blocks"][0] = 900e-6  # one slow block: the median of the pairs ignores it
    h = host_from_blocks(rows, SIZES)
    assert h.one_way_s[0] == pytest.approx(80e-6 + 256 * 3e-10)
    assert h.reverse_s[1] == pytest.approx(h.reverse_s[2]) == pytest.approx(80e-6 + (1 << 20) * 3e-10)
    assert h.call_s == pytest.approx(230e-6 - (170e-6 + 256 * 6e-10))  # less the smallest exchange
    assert h.spread["one_way_s"] > 10 and h.spread["exchange_s"] == 0.0 and h.spread["call_s"] == 0.0
    # the CPU per message and per call, at the smallest size: what ranks outnumbering cores share
    assert h.cpu_s == pytest.approx({"one_way_s": (80e-6 + 256 * 3e-10) / 2, "reverse_s": (80e-6 + 256 * 3e-10) / 2,
                                     "exchange_s": (170e-6 + 256 * 6e-10) / 2, "barrier_s": 115e-6, "call_s": 7e-6})
    assert HostProfile.from_dict(h.to_dict()) == h


def test_cpu_primitives_combine_per_key_and_old_profiles_load_without_them():
    """Calibrations before the CPU primitives load with an empty table, and the median of
    calibrations takes each CPU primitive over those that recorded it; a table that is not
    one is refused with a message naming it."""
    old = _host()
    assert old.cpu_s == {} and HostProfile.from_dict({k: v for k, v in old.to_dict().items() if k != "cpu_s"}) == old
    a, b, c = (dataclasses.replace(_host(), cpu_s={"one_way_s": x, "call_s": 2 * x}) for x in (40e-6, 50e-6, 90e-6))
    assert median_host([a, b, c]).cpu_s == {"call_s": 100e-6, "one_way_s": 50e-6}
    assert median_host([old, a]).cpu_s == {"call_s": 80e-6, "one_way_s": 40e-6}
    with pytest.raises(ValueError, match="cpu_s"):
        HostProfile.from_dict({**old.to_dict(), "cpu_s": [1e-6]})
    with pytest.raises(ValueError, match="finite"):
        HostProfile.from_dict({**old.to_dict(), "cpu_s": {"call_s": -1.0}})


def _host(scale: float = 1.0, call: float = 40e-6) -> HostProfile:
    one = [scale * (80e-6 + n * 3e-10) for n in SIZES]
    return HostProfile(2, call, SIZES, one, list(one), [2 * t for t in one], 3e-11, 2e-11,
                       spread={"one_way_s": 0.05 * scale})


def test_median_of_calibrations_ignores_one_disturbed_calibration():
    quiet, disturbed = _host(), _host(scale=1.25, call=60e-6)  # every message 25% slower
    m = median_host([quiet, disturbed, quiet])
    assert m.one_way_s == quiet.one_way_s and m.call_s == quiet.call_s
    assert gloo_op_time(m, "all_reduce", 1 << 16, 3) == gloo_op_time(quiet, "all_reduce", 1 << 16, 3)
    assert m.spread["between_one_way_s"] == pytest.approx(0.25)
    assert m.spread["between_call_s"] == pytest.approx(0.5)
    assert m.spread["one_way_s"] == pytest.approx(0.0625)  # the noisiest calibration's block spread
    assert HostProfile.from_dict(m.to_dict()) == m
    assert median_host([quiet]).one_way_s == quiet.one_way_s


def test_median_of_calibrations_refuses_what_cannot_be_combined():
    with pytest.raises(ValueError, match="no calibrations"):
        median_host([])
    with pytest.raises(ValueError, match="sizes or cores"):
        median_host([_host(), dataclasses.replace(_host(), cores=4)])


def test_calibration_grid_has_a_point_below_each_large_size():
    """Factor 4 from 256 B to 64 MiB, and 7/8 of each size from 256 KiB: a step in the cost
    per byte at a power of two (1 MiB on the development machine) lands in the last eighth
    of a span instead of being spread over all of it."""
    assert set(GRID) <= set(MESSAGE_SIZES) and list(MESSAGE_SIZES) == sorted(set(MESSAGE_SIZES))
    assert sorted(set(MESSAGE_SIZES) - set(GRID)) == [n * 7 // 8 for n in GRID if n >= 1 << 18]
    assert 917504 in MESSAGE_SIZES  # 7/8 MiB


def test_on_sizes_is_the_same_calibration_on_a_coarser_grid():
    """A step just below 1 MiB: with the point at 7/8 MiB a 741 KiB message is priced below
    the step; without it (the factor-4 grid) the interpolation from 256 KiB to 1 MiB puts it
    half way up. `on_sizes` drops the extra point from every table alike."""
    sizes = [256, 1 << 18, 917504, 1 << 20]
    one = [50e-6, 150e-6, 220e-6, 330e-6]
    fine = HostProfile(2, 40e-6, sizes, one, list(one), [2 * t for t in one], 3e-11, 2e-11,
                       copy_s=[n * 2e-11 for n in sizes], fresh_s=[n * 5e-11 for n in sizes])
    coarse = fine.on_sizes({256, 1 << 18, 1 << 20})
    assert coarse.sizes == [256, 1 << 18, 1 << 20] and coarse.one_way_s == [50e-6, 150e-6, 330e-6]
    assert coarse.exchange_s == [100e-6, 300e-6, 660e-6] and coarse.copy_s == [n * 2e-11 for n in coarse.sizes]
    n = 741455
    assert fine.message_time(n) == pytest.approx(150e-6 + 70e-6 * (n - (1 << 18)) / (917504 - (1 << 18)))
    assert coarse.message_time(n) == pytest.approx(150e-6 + 180e-6 * (n - (1 << 18)) / (3 << 18))
    assert fine.message_time(n) < coarse.message_time(n)
    assert HostProfile.from_dict(coarse.to_dict()) == coarse
    with pytest.raises(ValueError, match="two"):
        fine.on_sizes({256})


def test_ring_step_worlds_are_more_ranks_than_cores_up_to_two_per_core():
    assert ring_worlds(2) == [3, 4] and ring_worlds(1) == [2] and ring_worlds(3) == [4, 5, 6]
    assert ring_worlds(16) == []  # 17 ranks and more are not started: MAX_RING
    assert ring_worlds(6) == [7, 8]


def test_ring_steps_are_recorded_with_their_cpu_and_combined_per_world_size():
    """The calibration's ring rows (one per world size above the cores) become `ring_s` by
    world size, their CPU `cpu_s["ring_s/P"]`; profiles from before load without them, the
    median of calibrations takes each world size over those that recorded it, and a table
    keyed by anything but a world size is refused naming the field."""
    rows = _rows(lambda n: 80e-6 + n * 3e-10, lambda n: 170e-6 + n * 6e-10, 230e-6, 14e-6)
    rows["ring3"] = {"ring_s": {"all": 250e-6, "blocks": [250e-6] * 5, "cpu": 90e-6}}
    rows["ring4"] = {"ring_s": {"all": 380e-6, "blocks": [380e-6, 380e-6, 400e-6, 400e-6, 500e-6], "cpu": 120e-6}}
    h = host_from_blocks(rows, SIZES)
    assert h.ring_s == {"3": 250e-6, "4": 380e-6}
    assert h.spread["ring_s"] == pytest.approx(20 / 400)  # the noisier world size's (p75 - p25)/median
    assert h.cpu_s["ring_s/3"] == 90e-6 and h.cpu_s["ring_s/4"] == 120e-6
    assert HostProfile.from_dict(h.to_dict()) == h
    old = _host()
    assert old.ring_s == {} and HostProfile.from_dict({k: v for k, v in old.to_dict().items() if k != "ring_s"}) == old
    a, b = (dataclasses.replace(_host(), ring_s={"3": x, "4": 2 * x}) for x in (200e-6, 300e-6))
    c = dataclasses.replace(_host(), ring_s={"3": 900e-6})
    assert median_host([a, b, c]).ring_s == {"3": 300e-6, "4": 500e-6}
    assert median_host([old, a]).ring_s == {"3": 200e-6, "4": 400e-6}
    # it prices the model's turns, so the noise report compares it between calibrations too:
    # the median over world sizes of (max - min) / median, (900 - 200)/300 and (600 - 400)/500
    assert median_host([a, b, c]).spread["between_ring_s"] == pytest.approx((7 / 3 + 0.4) / 2)
    assert median_host([old, old]).spread["between_ring_s"] == 0.0
    with pytest.raises(ValueError, match="ring_s"):
        HostProfile.from_dict({**old.to_dict(), "ring_s": {"four": 1e-4}})
    with pytest.raises(ValueError, match="finite"):
        HostProfile.from_dict({**old.to_dict(), "ring_s": {"4": -1.0}})
