"""The host a calibrated Gloo model runs on: primitives measured once (`simdist calibrate`).

Kept apart from `profile` (which stores them beside the fitted curves) and `gloo_time`
(which executes Gloo's message programs with them) so both import it and neither the
other.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import asdict, dataclass, field, fields, replace


@dataclass
class HostProfile:
    """Primitives measured on the real backend (`simdist calibrate`), from which the Gloo
    model (`simdist.network.gloo_time`) predicts every collective at any world size.

    `one_way_s[i]`: one message of `sizes[i]` bytes between two ranks with nothing else in
    flight (half a ping-pong round trip), started by rank 0 and by rank 1 (`reverse_s`);
    `exchange_s[i]`: two messages in flight, both ranks sending to each other at once;
    `call_s`: one call into ProcessGroupGloo that moves no message (an all_reduce on a
    one-rank group: dispatch, hand-off to the worker thread, completion);
    `gamma`: seconds per byte of a float32 sum on one core (Gloo reduces 1 MiB segments);
    `copy_s[i]`/`fresh_s[i]`: one copy of `sizes[i]` bytes into an existing buffer and into
    a newly allocated one (its pages are faulted in as they are first written: above
    glibc's mmap threshold every allocation is fresh memory); `copy`: per byte, for
    profiles without the tables;
    `cores`: cores the ranks share (when busy threads outnumber them they take turns)."""

    cores: int
    call_s: float
    sizes: list[int]
    one_way_s: list[float]
    reverse_s: list[float]
    exchange_s: list[float]
    gamma: float
    copy: float
    # the calibration's own spread: per primitive the largest (p75-p25)/median over its blocks
    # (`real_backend.calibrate.block_summary`); "between_<primitive>": (max-min)/median over
    # the calibrations `median_host` combined (a table's: the median over its sizes)
    spread: dict[str, float] = field(default_factory=dict)
    copy_s: list[float] = field(default_factory=list)
    fresh_s: list[float] = field(default_factory=list)
    # CPU seconds of the whole rank process (every thread: the caller, ProcessGroupGloo's
    # workers, the tcp loop), the slowest rank's median, at the smallest size: per message of
    # a ping-pong ("one_way_s", "reverse_s": a rank sends half the messages and receives the
    # other half, so one message costs its two ends twice this), per exchange ("exchange_s":
    # one send end and one receive end) and per call ("barrier_s", "call_s"); recorded since
    # 2026-11-24 late for a model of ranks outnumbering cores, not used by the model yet
    cpu_s: dict[str, float] = field(default_factory=dict)
    # per world size p (a string, as JSON keys are) from cores+1 to 2*cores: one step of a p2p
    # ring on p ranks (each sends the smallest message to the next and receives one from the
    # previous, back to back), the slowest rank's 25th percentile; where ranks outnumber cores
    # and take turns; recorded since 2026-11-24 third session. The Gloo model prices a wake-up
    # on more ranks than cores from it (`gloo_time.turn_time`, docs/timing.md "Ranks taking
    # turns"); without it a wake-up is the latency
    ring_s: dict[str, float] = field(default_factory=dict)

    def message_time(self, nbytes: float) -> float:
        """One message alone: the measured one-way times, interpolated linearly in size
        between measured sizes (the smallest size's time below it; the last slope above)."""
        return _interp(self.sizes, [(a + b) / 2 for a, b in zip(self.one_way_s, self.reverse_s, strict=True)], nbytes)

    @property
    def latency(self) -> float:
        """The part of a message that does not grow with its size: the smallest message's
        time. The Gloo model spends it as the receiver's notice reaching the sender (a wait:
        no socket, no core) and as the delivery's wake-up (one core, not the socket), so
        messages in flight overlap their latencies."""
        return self.message_time(self.sizes[0])

    def byte_time(self, nbytes: float, footprint: float = 0.0) -> float:
        """The rest of one message alone: copying its bytes through the socket, which holds
        the pair's socket and keeps `demand` cores busy. Priced per byte as a message of
        `footprint` bytes (at least `nbytes`): a message cut from a larger buffer touches
        memory as large, out of cache alike. The Gloo model asks once per end of a message
        (the sender's buffer, the receiver's) and takes the mean (`gloo_time.buffers`)."""
        size = max(nbytes, footprint)
        if size <= 0:
            return 0.0
        return max(0.0, self.message_time(size) - self.latency) * nbytes / size

    def copy_time(self, nbytes: float) -> float:
        return _interp(self.sizes, self.copy_s, nbytes) * (nbytes > 0) if self.copy_s else nbytes * self.copy

    def fresh_time(self, nbytes: float) -> float:
        """Writing `nbytes` into a buffer allocated for the call (page faults included)."""
        return _interp(self.sizes, self.fresh_s, nbytes) * (nbytes > 0) if self.fresh_s else self.copy_time(nbytes)

    def demand(self, nbytes: float) -> float:
        """Cores one message keeps busy while its bytes move (the sender's write, the
        receiver's read), from the two-in-flight measurement: both ranks sending at once,
        each message's bytes took (exchange - latency) / (one-way - latency) times as long,
        which on `cores` cores means each wanted cores*that/2 cores; between 1 (one thread)
        and 2 (a thread at each end)."""
        two = max(0.0, _interp(self.sizes, self.exchange_s, nbytes) - self.latency)
        one = self.byte_time(nbytes)
        return min(2.0, max(1.0, self.cores * two / (2.0 * one))) if one > 0 else 1.0

    def on_sizes(self, keep: set[int] | frozenset[int]) -> HostProfile:
        """The same calibration with only the sizes in `keep` (at least two): what a coarser
        calibration grid would have predicted from the same measurements."""
        idx = [i for i, n in enumerate(self.sizes) if n in keep]
        if len(idx) < 2:
            raise ValueError("host: fewer than two calibrated sizes left")
        pick = {f.name: [getattr(self, f.name)[i] for i in idx] for f in fields(self)
                if f.name in ("sizes", "one_way_s", "reverse_s", "exchange_s") or (
                    f.name in ("copy_s", "fresh_s") and getattr(self, f.name))}
        return replace(self, **pick)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HostProfile:
        h = cls(**d)
        n = len(h.sizes)
        if n < 2 or any(len(x) != n for x in (h.one_way_s, h.reverse_s, h.exchange_s)) or any(
                len(x) not in (0, n) for x in (h.copy_s, h.fresh_s)):
            raise ValueError("host: sizes, one_way_s, reverse_s, exchange_s (and copy_s, fresh_s) must have the "
                             "same length >= 2")
        if not isinstance(h.cpu_s, dict):
            raise ValueError("host: cpu_s must be a table of CPU seconds per message or call")
        if not isinstance(h.ring_s, dict) or not all(str(k).isdigit() for k in h.ring_s):
            raise ValueError("host: ring_s must be a table of seconds per ring step by world size")
        if h.sizes != sorted(set(h.sizes)) or h.cores < 1:
            raise ValueError("host: sizes must increase and cores be >= 1")
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
                   for x in [h.call_s, h.gamma, h.copy, *h.one_way_s, *h.reverse_s, *h.exchange_s, *h.copy_s,
                             *h.fresh_s, *h.cpu_s.values(), *h.ring_s.values()]):
            raise ValueError("host: times must be finite numbers >= 0")
        return h


#: Primitives `median_host` compares between calibrations (tables: the median over sizes or
#: world sizes). `ring_s` is one since it prices the Gloo model's turns (`gloo_time.turn_time`).
BETWEEN = ("call_s", "one_way_s", "reverse_s", "exchange_s", "gamma", "copy_s", "fresh_s", "ring_s")


def median_host(hosts: list[HostProfile]) -> HostProfile:
    """Several calibrations of one host combined: every primitive the median over them
    (size by size for the tables). A calibration takes seconds and a burst of load from
    other processes can shift all of it (two calibrations 16 minutes apart on 2026-11-24:
    every message 10-28% slower in the second, and the prediction from it 2.5 times as far
    off); spread over a run and combined by the median, one disturbed calibration moves
    nothing. `spread` keeps each primitive's largest block spread and adds, as
    "between_<primitive>", how far the calibrations disagree ((max - min) / median; for a
    table the median over its sizes: the typical disagreement, not one size's microseconds
    of jitter)."""
    if not hosts:
        raise ValueError("median_host: no calibrations")
    if any(h.sizes != hosts[0].sizes or h.cores != hosts[0].cores for h in hosts):
        raise ValueError("median_host: calibrations with different sizes or cores")
    out = {}
    for f in fields(HostProfile):
        vals = [getattr(h, f.name) for h in hosts]
        if f.name in ("cores", "sizes", "spread"):
            out[f.name] = vals[0]
        elif isinstance(vals[0], dict):  # per key, over the calibrations that recorded it
            out[f.name] = {k: statistics.median([v[k] for v in vals if k in v]) for k in sorted({k for v in vals
                                                                                               for k in v})}
        elif isinstance(vals[0], list):
            out[f.name] = [statistics.median(col) for col in zip(*vals, strict=True)] if vals[0] else []
        else:
            out[f.name] = statistics.median(vals)
    spread = {k: max(h.spread.get(k, 0.0) for h in hosts) for k in sorted({k for h in hosts for k in h.spread})
              if not k.startswith("between_")}
    for k in BETWEEN:
        vals = [getattr(h, k) for h in hosts]
        if isinstance(out[k], dict):  # per world size, over the calibrations that recorded it
            cols = [[v[key] for v in vals if key in v] for key in out[k]]
        else:
            cols = list(zip(*vals, strict=True)) if isinstance(out[k], list) else [vals]
        spread[f"between_{k}"] = statistics.median([_range(c) for c in cols]) if cols else 0.0
    out["spread"] = spread
    return HostProfile(**out)


def _range(xs) -> float:
    """(max - min) / median; 0 for a median of 0."""
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else 0.0


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    """Piecewise-linear through (xs, ys); flat below xs[0], the last segment's slope above."""
    if x <= xs[0]:
        return ys[0]
    i = min(bisect.bisect_left(xs, x), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

