"""An accused process that breaks the protocol on purpose ($FAKE_ACCUSED_MODE), for
test_accused_channel.py: it answers `ready`, then misbehaves on its first command."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import struct
import time

from ksearch_harness import channel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--channel-fd", type=int, required=True)
    ap.add_argument("--backend")
    args = ap.parse_args()
    sock = socket.socket(fileno=args.channel_fd)
    channel.send(sock, {"seq": 0, "ok": True, "op": "ready", "pid": os.getpid()})
    mode = os.environ.get("FAKE_ACCUSED_MODE", "")
    msg, _ = channel.recv_with_fds(sock)
    seq = msg["seq"]
    if mode == "garbage":
        sock.sendall(b"\x00\x00\x00\x05hello")
    elif mode == "oversized":
        sock.sendall(struct.pack(">I", 1 << 30) + b"{}")
    elif mode == "not_an_object":
        body = json.dumps([1, 2, 3]).encode()
        sock.sendall(struct.pack(">I", len(body)) + body)
    elif mode == "wrong_seq":
        channel.send(sock, {"seq": seq + 7, "ok": True, "ns": 1})
    elif mode == "exit":
        os._exit(3)
    elif mode == "crash":
        ctypes.string_at(1)  # SIGSEGV
    elif mode == "hang":
        time.sleep(3600)
    elif mode == "torn":
        sock.sendall(struct.pack(">I", 100) + b'{"seq": 1')
        time.sleep(3600)
    else:
        channel.send(sock, {"seq": seq, "ok": True})
    time.sleep(3600)


if __name__ == "__main__":
    main()
