"""Element types of the protocol (``f32``, ``bf16``, ...): numpy storage, conversion to float64
for comparisons, and the poison bit patterns written into outputs before a candidate runs."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import parallel


# Shared reference views of read-only storage arrays: (id, type name) -> (weak reference to
# the array, view). An entry leaves with its array, so the views kept are those of the kept
# input sets (twice their size for bf16, whose view is float32).
_SHARED_VIEWS: dict[tuple[int, str], tuple[weakref.ref, np.ndarray | None]] = {}


@dataclass(frozen=True)
class DType:
    name: str
    storage: np.dtype  # what the buffers hold (bf16 has no numpy type: its bits live in uint16)
    bits: np.dtype  # unsigned integer of the same width, to compare and write exact bit patterns
    is_float: bool
    # Two distinct patterns; for floats they are quiet NaNs with payloads that arithmetic never
    # produces, so a poison value still present after a call was not written by the candidate.
    poison_a: int
    poison_b: int

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Values (any numeric array) to storage, rounding to nearest even."""
        if self.name == "bf16":
            return _f32_to_bf16_bits(np.asarray(values, dtype=np.float32))
        if self.name == "bool":
            return np.asarray(values).astype(bool)
        return np.asarray(values).astype(self.storage)

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """Storage to float64 (exact for every supported type but 64-bit integers > 2^53)."""
        if self.name == "bf16":
            return _bf16_bits_to_f32(stored).astype(np.float64)
        return np.asarray(stored).astype(np.float64)

    def decode_exact(self, stored: np.ndarray) -> np.ndarray:
        """Storage to the narrowest float array that holds every value exactly, for
        comparisons: float32 for f16, bf16 and f32 (half the memory traffic of float64; core's
        comparisons compute in float64 either way), float64 otherwise. An f32 array is returned
        as it is, not copied."""
        if self.name == "bf16":
            return _bf16_bits_to_f32(stored)
        if self.name == "f32":
            return np.asarray(stored)
        if self.name == "f16":
            return parallel.copy(stored, np.float32)
        return self.decode(stored)

    def reference_view(self, stored: np.ndarray) -> np.ndarray:
        """What reference.py receives: the storage itself, except bf16, which is handed over as
        the float32 values it represents."""
        if self.name == "bf16":
            return _bf16_bits_to_f32(stored)
        return stored

    def shared_reference_view(self, stored: np.ndarray) -> np.ndarray | None:
        """`reference_view` of a read-only storage array (a kept input set: draw_cache), made
        once, read-only itself, and handed to every caller while `stored` lives; None for a
        writable array, whose callers need views of their own."""
        if not isinstance(stored, np.ndarray) or stored.flags.writeable:
            return None
        key = (id(stored), self.name)
        hit = _SHARED_VIEWS.get(key)
        if hit is not None and hit[0]() is stored:
            return stored if hit[1] is None else hit[1]
        view = self.reference_view(stored)
        if view is not stored:
            view.flags.writeable = False
        # The array itself is not held here (None stands for it), or it would never leave.
        _SHARED_VIEWS[key] = (weakref.ref(stored, lambda _r: _SHARED_VIEWS.pop(key, None)),
                              None if view is stored else view)
        return view

    def poison(self, shape: tuple[int, ...], which: str) -> np.ndarray:
        pattern = self.poison_a if which == "a" else self.poison_b
        return np.full(shape, pattern, dtype=self.bits).view(self.storage)

    def poison_mask(self, stored: np.ndarray, which: str) -> np.ndarray:
        pattern = self.poison_a if which == "a" else self.poison_b
        return np.asarray(stored).view(self.bits) == self.bits.type(pattern)


# Elements per piece of the bf16 rounding: its uint32 temporary stays in cache, and its numpy
# calls are few enough per element that threads do not queue for the GIL.
_BF16_PIECE = 1 << 18
# Above this many elements a conversion is spread over the thread pool.
_BF16_PARALLEL = 1 << 20
BF16_NAN = 0x7FC0


def contiguous(a: Any, dtype: Any = None) -> np.ndarray:
    """`a` as a C-contiguous array of its own shape. np.ascontiguousarray alone turns a 0-d
    array (a scalar input) into shape (1,), which a device tensor of shape () refuses."""
    arr = np.asarray(a, dtype=dtype)
    return np.ascontiguousarray(arr).reshape(arr.shape)


def _f32_to_bf16_bits(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values (anything convertible) to bf16 bit patterns, rounding to nearest even;
    every NaN becomes the quiet NaN 0x7FC0. Computed in uint32 pieces, into `out` when given
    (a uint16 array of x's shape)."""
    x = contiguous(x, np.float32)
    if out is None:
        out = np.empty(x.shape, dtype=np.uint16)
    src, dst = x.reshape(-1), out.reshape(-1)
    if src.size > _BF16_PARALLEL:
        parallel.map_ranges(lambda lo, hi: bf16_round_into(src[lo:hi], dst[lo:hi]),
                            src.size, _BF16_PARALLEL)
    else:
        bf16_round_into(src, dst)
    return out


def bf16_round_into(src: np.ndarray, dst: np.ndarray) -> None:
    """dst[:] = the bf16 bits of float32 `src` (1-d, contiguous), on the calling thread."""
    for lo in range(0, src.size, _BF16_PIECE):
        x = src[lo:lo + _BF16_PIECE]
        bits = x.view(np.uint32)
        # Round to nearest even: add 0x7FFF plus the lowest kept bit, keep the upper half.
        # Only NaN patterns can wrap around 2^32 here, and NaNs are overwritten below.
        t = np.right_shift(bits, 16)
        t &= 1
        t += 0x7FFF
        t += bits
        t >>= 16
        d = dst[lo:lo + _BF16_PIECE]
        np.copyto(d, t, casting="unsafe")
        nan = np.isnan(x)
        if nan.any():
            d[nan] = BF16_NAN


def _bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    b = contiguous(b, np.uint16)
    out = np.empty(b.shape, dtype=np.uint32)
    src, dst = b.reshape(-1), out.reshape(-1)

    def piece(lo: int, hi: int) -> None:
        np.left_shift(src[lo:hi], 16, out=dst[lo:hi], dtype=np.uint32)

    if src.size > _BF16_PARALLEL:
        parallel.map_ranges(piece, src.size, _BF16_PARALLEL)
    else:
        piece(0, src.size)
    return out.view(np.float32)


# Words per piece of same_bytes: large arrays are compared by the pool.
_SAME_BYTES_PIECE = 1 << 20


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bytes (a.tobytes() == b.tobytes(), without copies)."""
    if a.nbytes != b.nbytes:
        return False
    wa, wb = _words(a), _words(b)  # of one width: it depends on nbytes only
    return all(parallel.map_ranges(lambda lo, hi: bool(np.array_equal(wa[lo:hi], wb[lo:hi])),
                                   wa.size, _SAME_BYTES_PIECE))


def _words(a: np.ndarray) -> np.ndarray:
    """The bytes of `a` in C order, as the widest unsigned integers that tile them."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    for width in (np.uint64, np.uint32, np.uint16):
        if flat.size % np.dtype(width).itemsize == 0:
            return flat.view(width)
    return flat


def _int(name: str, np_type: type, bits: type) -> DType:
    width = np.dtype(bits).itemsize
    return DType(name, np.dtype(np_type), np.dtype(bits), False,
                 int.from_bytes(b"\x5a" * width, "little"), int.from_bytes(b"\xa5" * width, "little"))


DTYPES: dict[str, DType] = {
    "f16": DType("f16", np.dtype(np.float16), np.dtype(np.uint16), True, 0x7E5A, 0x7E35),
    "bf16": DType("bf16", np.dtype(np.uint16), np.dtype(np.uint16), True, 0x7FDA, 0x7FC5),
    "f32": DType("f32", np.dtype(np.float32), np.dtype(np.uint32), True, 0x7FD5A5A5, 0x7FCA5A5A),
    "f64": DType("f64", np.dtype(np.float64), np.dtype(np.uint64), True,
                 0x7FF8A5A5A5A5A5A5, 0x7FF85A5A5A5A5A5A),
    "i8": _int("i8", np.int8, np.uint8),
    "i16": _int("i16", np.int16, np.uint16),
    "i32": _int("i32", np.int32, np.uint32),
    "i64": _int("i64", np.int64, np.uint64),
    "u8": _int("u8", np.uint8, np.uint8),
    "u32": _int("u32", np.uint32, np.uint32),
    "bool": DType("bool", np.dtype(np.bool_), np.dtype(np.uint8), False, 0x5A, 0xA5),
}

# Tolerances used when the request gives none for a dtype, and to judge whether a failure looks
# like arithmetic done in a narrower type. The reduced-precision ones allow about four units of
# roundoff of the narrow type (f16: 2^-11, bf16: 2^-8), scaled like any tolerance.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "f64": (1e-10, 1e-12),
    "f32": (2e-5, 1e-5),
    "f16": (2e-3, 2e-3),
    "bf16": (1.6e-2, 1.6e-2),
}
REDUCED_PRECISION = ("f16", "bf16")


def get(name: str) -> DType:
    return DTYPES[name]
