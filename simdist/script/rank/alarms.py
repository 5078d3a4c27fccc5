"""A main-thread `time.sleep` that a signal cuts short, on the simulated clock.

`signal.alarm(1)` (or `setitimer(ITIMER_REAL, 1)`) with a handler that raises, then
`time.sleep(5)`: the sleep ends at the signal, 1 s in, its handler's exception out of it (a
handler that returns lets the sleep go on to its end, PEP 475; the default action ends the
process there). The simulated side tells each main-thread sleep to the coordinator before it
sleeps, which moves the rank's clock by its whole length (`RankConn.sleep`), so the sleep
counted 5 s. A sleep that a one-shot real-time timer would end within its length (`due_within`)
is slept in two: to the timer (`land`: its handler runs there), then, if that returned, the
rest. The timer runs on the script's clock (`shift`): simulated time the coordinator skips
(`rank.simclock.advance_to`) brings it nearer, as it brings a told sleep's end nearer.
Periodic timers (an interval) and other signals (a peer process's `kill`) are not modelled: a
sleep they cut still counts in full.
"""

from __future__ import annotations

import signal
from collections.abc import Callable


def due_within(seconds: float) -> float | None:
    """When (seconds from now) a one-shot real-time timer fires within a sleep of `seconds` on
    the main thread, its signal not ignored; None: no such timer."""
    if signal.getsignal(signal.SIGALRM) is signal.SIG_IGN:
        return None
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    return left if 0 < left < seconds and not interval else None


def land(real_sleep: Callable[[float], None]) -> None:
    """Wait (for real) for the real-time timer that is due now: its signal interrupts the wait
    and its handler runs on this thread (one that raises ends the caller's sleep here)."""
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    if left > 0:
        real_sleep(left)


def shift(skipped: float) -> None:
    """Simulated time skipped (`rank.simclock.advance_to`): a one-shot real-time timer comes
    that much nearer (at once, when it is passed)."""
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    if left > 0 and skipped > 0 and not interval:
        signal.setitimer(signal.ITIMER_REAL, max(left - skipped, 1e-6))
