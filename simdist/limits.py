"""Resource limits: how much work and memory one input may ask for, stated and checked
before the work starts.

A scenario is a small program, and a valid one can still ask for work no machine finishes
(``counts = [1000000000]``, a 4 TB all_reduce that ranks issue with different sizes) or
memory no machine has (a 1 GB file of TOML). So each kind of work has a limit, checked
before it starts, with a default that keeps one run within a few hundred MB and a minute or two,
and an environment variable that raises it; the error says which limit was hit and how:

==================  =========  ================================================================
limit               default    what it bounds (environment variable ``SIMDIST_MAX_<NAME>``)
==================  =========  ================================================================
``file_bytes``      1 MiB      one input file: scenario, template, calibrated profile
``data_items``      1,000,000  values (tables and lists included) in one scenario or template
``ops``             2,000,000  operations one run may perform over all ranks: collectives,
                               p2p and compute steps (an upper bound estimated before the run,
                               `simdist.program.budget`; also the trace entries it may record)
``messages``        200,000    Gloo messages that modelling one mismatched collective takes
                               (over its ranks; `simdist.engine.gloo_rules`)
``local_ranks``     64         rank processes one run starts on this host: a user's script's
                               (``--nproc-per-node``, the fuzzer's world sizes, the world_size
                               a self-launching script initialises) and a scenario's on the
                               real backend (its ``world_size``): each is a Python process
                               that imports torch (~250 MB)
==================  =========  ================================================================

The report a run returns holds at most ``ops`` trace entries, so its size is bounded too.

The schema's fixed bounds (not raisable: beyond them the input is a mistake, not a big job)
are the constants below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from simdist.errors import InputError, LimitError

MAX_WORLD_SIZE = 1024  # ranks in one scenario
MAX_NUMEL = 1 << 48  # elements of one tensor (2**48 x 16 B stays far inside int64 bytes)
MAX_TIMEOUT_S = 86_400.0  # the real backend's watchdog, and one compute/sleep step: a day
MAX_DEPTH = 32  # nesting of tables and lists in a scenario or template
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)


@dataclass(frozen=True)
class Limit:
    """One resource limit: its default, and the environment variable that overrides it."""

    name: str
    default: int
    unit: str

    @property
    def env(self) -> str:
        return f"SIMDIST_MAX_{self.name.upper()}"

    def value(self) -> int:
        """The limit in force: the environment variable's value, else the default."""
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return self.default
        try:
            v = int(raw.strip().replace("_", ""))
        except ValueError:
            raise InputError(f"{self.env}: not a whole number ({raw!r})") from None
        if v < 1:
            raise InputError(f"{self.env}: must be >= 1, got {v}")
        return v

    def check(self, amount: int, where: str, what: str) -> None:
        """Raise LimitError ("WHERE: WHAT is over the limit ...") when `amount` exceeds the limit."""
        lim = self.value()
        if amount > lim:
            raise LimitError(f"{where}: {what}, over the limit of {lim:,} {self.unit} "
                             f"(set {self.env}={_suggest(amount)} to allow it)")


def _suggest(amount: int) -> int:
    """A round number at least `amount`: what to set the variable to."""
    s = 1
    while s < amount:
        s *= 10
    for m in (1, 2, 5):
        if s // 10 * m >= amount:
            return s // 10 * m
    return s


FILE_BYTES = Limit("file_bytes", 1 << 20, "bytes per input file")
DATA_ITEMS = Limit("data_items", 1_000_000, "values per scenario or template")
OPS = Limit("ops", 2_000_000, "operations per run")
MESSAGES = Limit("messages", 200_000, "Gloo messages per mismatched collective")
LOCAL_RANKS = Limit("local_ranks", 64, "rank processes per run on this host")
LIMITS: tuple[Limit, ...] = (FILE_BYTES, DATA_ITEMS, OPS, MESSAGES, LOCAL_RANKS)


def check_timeout(seconds: float, what: str = "--timeout") -> float:
    """A watchdog timeout as given (`what` names it in the error): a finite number of
    seconds, more than 0 and at most MAX_TIMEOUT_S; anything else is an InputError."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (0 < seconds <= MAX_TIMEOUT_S):
        raise InputError(f"{what}: must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}, got {seconds!r}")
    return float(seconds)
