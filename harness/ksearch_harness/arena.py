"""Shared memory between the judge and one accused process.

An arena is an anonymous shared file (memfd on Linux, an unlinked temporary file elsewhere)
mapped by both. The judge lays tensors out in it and reads and writes them through numpy views;
the accused maps the same descriptor. On the cpu backend the candidate computes directly on
these pages, so the judge sees its outputs without asking it; on GPU backends the accused copies
between the arena and its device buffers when told to.

Pages are only materialised when touched, so an arena sized for every workload of a request
costs what the evaluated workloads use.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from dataclasses import dataclass

# Tensor offsets are multiples of this: a page, so a tensor never shares a cache line (or a
# page) with another, and any SIMD alignment a kernel may assume holds.
ALIGN = 4096


def _round_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Placement:
    offset: int
    nbytes: int


class Layout:
    """Offsets of named tensors in one arena, assigned in order."""

    def __init__(self) -> None:
        self.size = 0

    def place(self, nbytes: int) -> Placement:
        p = Placement(self.size, nbytes)
        self.size += _round_up(max(nbytes, 1))
        return p


class Arena:
    """The judge's end: owns the descriptor and a mapping."""

    def __init__(self, size: int, name: str = "ksearch-arena"):
        self.size = max(_round_up(size), ALIGN)
        self.fd = _anonymous_file(name, self.size)
        self.map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            # numpy views still reference the mapping; it goes with them.
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


def _anonymous_file(name: str, size: int) -> int:
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fd = memfd(name, getattr(os, "MFD_CLOEXEC", 1))
    else:  # macOS: an unlinked temporary file behaves the same for our purposes
        fd, path = tempfile.mkstemp(prefix=name + "-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd
