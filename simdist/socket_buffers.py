"""How many bytes this machine's kernel takes into a TCP connection's buffers before a sender
must wait for its receiver to read: what decides whether a Gloo send to a receiver that dies
completes (`simdist.races.SendBandRace`).

Gloo writes a send of an unbound buffer into its pair's socket once the receiver's "ready"
notice has come (gloo/transport/tcp/pair.cc: `handleRemotePendingRecv` -> `sendUnboundBuffer`,
a non-blocking `writev`); the send completes when every byte is written, and what the socket
does not take at once waits in the pair's transmit queue for the receiver to read. If the
receiver's process ends first, the closure does not reach that queue's unbound buffers
(`Pair::signalException` looks at `op.buf` only), so the send waits out its timeout. So a send
that the kernel takes whole before the receiver goes completes whatever the receiver does next;
a longer one depends on how long the receiver lives and reads.

What the kernel takes whole on a young connection is its send buffer as sized at connect
(grown from `tcp_wmem`'s default towards its maximum by the congestion window, by a
kernel-version formula) plus the receiver's first window (from `tcp_rmem`'s default); both
grow with the connection's traffic up to the maxima of `net.ipv4.tcp_wmem` and `tcp_rmem`. The
first is measured by filling a fresh loopback connection (`tests/test_send_band.py`'s
`young_capacity`, the kernel's own answer: 3,919,467 bytes here), the ceiling is the two maxima.
What is taken whole even while the receiver dies is less: one copy of at most the default send
buffer (`whole_write`), the only figure `compare` needs (`simdist.races.SendBandRace`).
"""

from __future__ import annotations

from pathlib import Path

_SYSCTL = Path("/proc/sys/net/ipv4")


def tcp_setting(name: str, field: int) -> int | None:
    """Field `field` (0 the minimum, 1 the default, 2 the maximum) of `net.ipv4.<name>`
    (tcp_wmem, tcp_rmem); None where it cannot be read (not Linux)."""
    try:
        return int((_SYSCTL / name).read_text().split()[field])
    except (OSError, IndexError, ValueError):
        return None


def whole_write() -> int:
    """The largest send the kernel takes whole in one copy whatever the receiver does meanwhile:
    the default send buffer every socket starts with (`tcp_wmem`'s default; 16 KB where it
    cannot be read, Linux's own default). A longer one is copied segment by segment, and a
    receiver that dies meanwhile resets the connection and cuts the write short (measured: 3
    and 3.7 MB sends, within a fresh connection's capacity, timed out in 1 of 20 and 1 of 10 runs with
    their receiver killed)."""
    return tcp_setting("tcp_wmem", 1) or 16384
