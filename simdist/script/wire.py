"""The framing between rank processes and the coordinator: a JSON header plus raw buffers.

One message is `!II` (header length, number of buffers), the UTF-8 JSON header, then per
buffer `!Q` (its length) and its bytes. Tensor data travels as raw bytes next to the
header, never pickled and never inside the JSON. Both sides import only the standard
library from here: rank processes must stay light (this runs in the user's processes).
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

_HEAD = struct.Struct("!II")
_BUF = struct.Struct("!Q")

Message = tuple[dict[str, Any], list[bytearray]]


def encode_header(header: dict[str, Any], sizes: Sequence[int]) -> bytes:
    """Everything of a message before its first buffer's bytes (one `sendall`)."""
    h = json.dumps(header, separators=(",", ":")).encode()
    return _HEAD.pack(len(h), len(sizes)) + h


def send(sock: socket.socket, header: dict[str, Any], buffers: Sequence[bytes | bytearray | memoryview] = ()) -> None:
    """Send one message (callers serialise concurrent senders with a lock)."""
    views = [memoryview(b).cast("B") for b in buffers]
    parts = [encode_header(header, [v.nbytes for v in views])]
    for v in views:
        parts.append(_BUF.pack(v.nbytes))
        if v.nbytes <= 65536:
            parts.append(bytes(v))
        else:
            sock.sendall(b"".join(parts))
            parts = []
            sock.sendall(v)
    if parts:
        sock.sendall(b"".join(parts))


def _recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return buf


def recv(sock: socket.socket) -> Message | None:
    """Block for one message; None when the other side closed the connection."""
    head = _recv_exact(sock, _HEAD.size)
    if head is None:
        return None
    hlen, nbuf = _HEAD.unpack(head)
    raw = _recv_exact(sock, hlen)
    if raw is None:
        return None
    buffers: list[bytearray] = []
    for _ in range(nbuf):
        size = _recv_exact(sock, _BUF.size)
        if size is None:
            return None
        data = _recv_exact(sock, _BUF.unpack(size)[0])
        if data is None:
            return None
        buffers.append(data)
    return json.loads(raw), buffers


class Decoder:
    """Incremental decoding for a non-blocking reader: feed bytes, take whole messages."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while (msg := self._take()) is not None:
            out.append(msg)
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        return out

    def _take(self) -> Message | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _HEAD.size:
            return None
        hlen, nbuf = _HEAD.unpack_from(buf, pos)
        p = pos + _HEAD.size + hlen
        if len(buf) < p:
            return None
        header = json.loads(bytes(buf[pos + _HEAD.size : p]))
        buffers: list[bytearray] = []
        for _ in range(nbuf):
            if len(buf) < p + _BUF.size:
                return None
            (size,) = _BUF.unpack_from(buf, p)
            p += _BUF.size
            if len(buf) < p + size:
                return None
            buffers.append(bytearray(buf[p : p + size]))
            p += size
        self._pos = p
        return header, buffers
