"""Element types of the protocol (``f32``, ``bf16``, ...): numpy storage, conversion to float64
for comparisons, and the poison bit patterns written into outputs before a candidate runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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

    def reference_view(self, stored: np.ndarray) -> np.ndarray:
        """What reference.py receives: the storage itself, except bf16, which is handed over as
        the float32 values it represents."""
        if self.name == "bf16":
            return _bf16_bits_to_f32(stored)
        return stored

    def poison(self, shape: tuple[int, ...], which: str) -> np.ndarray:
        pattern = self.poison_a if which == "a" else self.poison_b
        return np.full(shape, pattern, dtype=self.bits).view(self.storage)

    def poison_mask(self, stored: np.ndarray, which: str) -> np.ndarray:
        pattern = self.poison_a if which == "a" else self.poison_b
        return np.asarray(stored).view(self.bits) == self.bits.type(pattern)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    out[np.isnan(x)] = 0x7FC0
    return out


def _bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


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
