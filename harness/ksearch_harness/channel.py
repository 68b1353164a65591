"""The judge's line to an accused process: one stream socket, messages framed as a 4-byte
big-endian length followed by that many bytes of JSON (one object).

Both ends use this module, but they trust it differently. The accused reads only what the judge
wrote. The judge reads what an untrusted process wrote, so every read is bounded (size, time)
and every malformed frame is an `AccusedProtocolError`, never a crash of the judge. File
descriptors travel judge -> accused only (SCM_RIGHTS, for shared-memory arenas); the judge reads
with plain `recv`, which discards any descriptor the accused tries to send back.

Standard library only: the cpu accused imports nothing else.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
# A reply carries timings and short messages; a frame this large means something else is
# writing to the socket.
MAX_FRAME = 1 << 20


class AccusedProtocolError(Exception):
    """The peer broke the framing: garbage, an oversized frame, or a closed socket."""


class AccusedTimeout(Exception):
    """No complete frame within the time allowed."""


def send(sock: socket.socket, obj: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    frame = HEADER.pack(len(body)) + body
    if fds:
        socket.send_fds(sock, [frame[:HEADER.size]], list(fds))
        sock.sendall(frame[HEADER.size:])
    else:
        sock.sendall(frame)


def recv(sock: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    """One message. `deadline` is a time.monotonic() value; None waits for ever."""
    header = _read_exact(sock, HEADER.size, deadline)
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise AccusedProtocolError(f"a frame of {n} bytes (at most {MAX_FRAME} are accepted)")
    body = _read_exact(sock, n, deadline)
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise AccusedProtocolError(f"a frame that is not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise AccusedProtocolError("a frame that is not a JSON object")
    return obj


def recv_with_fds(sock: socket.socket, max_fds: int = 4) -> tuple[dict[str, Any], list[int]]:
    """The accused's side: one message and the descriptors sent with its first bytes."""
    header, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, max_fds)
    if not header:
        raise AccusedProtocolError("the judge closed the channel")
    if len(header) < HEADER.size:
        header += _read_exact(sock, HEADER.size - len(header), None)
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise AccusedProtocolError(f"a frame of {n} bytes")
    obj = json.loads(_read_exact(sock, n, None))
    if not isinstance(obj, dict):
        raise AccusedProtocolError("a frame that is not a JSON object")
    return obj, fds


def _read_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AccusedTimeout(f"no complete frame in time ({len(buf)} of {n} bytes)")
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                continue
        try:
            chunk = sock.recv(n - len(buf))
        except InterruptedError:
            continue
        except OSError as e:
            raise AccusedProtocolError(f"the channel failed: {e}") from None
        if not chunk:
            raise AccusedProtocolError("the channel was closed")
        buf += chunk
    return bytes(buf)


def pair() -> tuple[socket.socket, socket.socket]:
    """(judge end, accused end). The accused end is inheritable; the judge end is not."""
    judge, accused = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    os.set_inheritable(accused.fileno(), True)
    return judge, accused
