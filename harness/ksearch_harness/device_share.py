"""Device memory the judge shares with one accused process (cuda backend).

The judge allocates a buffer with the CUDA driver's virtual memory API (cuMemCreate, exportable
as a POSIX file descriptor), maps it in its own context and sends the descriptor over the
accused's channel (SCM_RIGHTS, like the host arena); the accused imports and maps the same
physical memory in its context. Both then see one buffer: the judge writes inputs and poison
and reads outputs on the device, without the host round trips of the arena (arena.py).

Only what the judge exports is shared: its own allocations (reference outputs, pristine copies
of the inputs, the truth) are ordinary allocations of its context, which the accused cannot
name. What the accused may do to a shared buffer (write an input, keep writing an output after
its call returned) is what the judge's checks already look for.

The driver is reached through ctypes (libcuda.so.1), so nothing beyond the driver and the
image's PyTorch is needed; `available()` says whether this device can export such memory.

`KSEARCH_HARNESS_DEVICE_SHARE` picks the mode: `auto` (default: share where the driver can),
`off` (the judge reaches the accused's buffers through the host arena only), or `emulate`
(tests without a GPU: a memfd stands in for device memory and tensors are host tensors over
it, so the judge/accused protocol and the checks run as on a GPU).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103


MODE_ENV = "KSEARCH_HARNESS_DEVICE_SHARE"
MODES = ("auto", "off", "emulate")


def mode() -> str:
    """The sharing mode from $KSEARCH_HARNESS_DEVICE_SHARE (unknown values: `auto`)."""
    m = os.environ.get(MODE_ENV, "").strip().lower()
    return m if m in MODES else "auto"


class ShareError(RuntimeError):
    """A driver call of the sharing failed (its name and the driver's message)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver: Any = None


def _cuda() -> Any:
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        u64, size_t = ctypes.c_uint64, ctypes.c_size_t
        sigs = {
            "cuInit": [ctypes.c_uint],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
            "cuCtxSetCurrent": [ctypes.c_void_p],
            "cuMemGetAllocationGranularity": [ctypes.POINTER(size_t),
                                              ctypes.POINTER(_AllocationProp), ctypes.c_int],
            "cuMemCreate": [ctypes.POINTER(u64), size_t, ctypes.POINTER(_AllocationProp), u64],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, u64],
            "cuMemMap": [u64, size_t, size_t, u64, u64],
            "cuMemSetAccess": [u64, size_t, ctypes.POINTER(_AccessDesc), size_t],
            "cuMemExportToShareableHandle": [ctypes.c_void_p, u64, ctypes.c_int, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), ctypes.c_void_p,
                                               ctypes.c_int],
            "cuMemUnmap": [u64, size_t],
            "cuMemRelease": [u64],
            "cuMemAddressFree": [u64, size_t],
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuMemcpyDtoD_v2": [u64, u64, size_t],
            "cuCtxSynchronize": [],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        _driver = lib
    return _driver


def load_driver() -> None:
    """Loads the CUDA driver library and its entry points (OSError if it cannot)."""
    _cuda()


def _check(name: str, rc: int) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(rc, ctypes.byref(msg))
        text = msg.value.decode(errors="replace") if msg.value else "unknown error"
        raise ShareError(f"{name} failed: {text} (CUresult {rc})")


def _context(device: int) -> None:
    """Makes the device's primary context (the one PyTorch uses) current on this thread."""
    cu = _cuda()
    _check("cuInit", cu.cuInit(0))
    ctx = ctypes.c_void_p()
    _check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device))
    _check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))


def _prop(device: int) -> _AllocationProp:
    p = _AllocationProp()
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    p.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
    return p


def available(device: int = 0) -> tuple[bool, str]:
    """(whether this device can share memory by file descriptor, why not), in this mode."""
    m = mode()
    if m == "off":
        return False, f"turned off ({MODE_ENV}=off)"
    if m == "emulate":
        return True, ""
    try:
        _context(device)
        cu = _cuda()
        for attr, what in ((CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                            "virtual memory management"),
                           (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                            "export to a file descriptor")):
            v = ctypes.c_int()
            _check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(ctypes.byref(v), attr,
                                                                    device))
            if not v.value:
                return False, f"the device does not support {what}"
    except (OSError, ShareError) as e:
        return False, str(e)
    return True, ""


def granularity(device: int = 0) -> int:
    if mode() == "emulate":
        return 1 << 16
    _context(device)
    g = ctypes.c_size_t()
    p = _prop(device)
    _check("cuMemGetAllocationGranularity", _cuda().cuMemGetAllocationGranularity(
        ctypes.byref(g), ctypes.byref(p), CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return int(g.value)


@dataclass
class Mapping:
    """One shared allocation mapped in this process: device address `ptr`, `size` bytes."""
    ptr: int
    size: int
    handle: int  # -1: emulated (`host` is the memory)
    device: int
    closed: bool = False
    host: Any = None

    @property
    def emulated(self) -> bool:
        return self.handle < 0

    def close(self) -> None:
        """Unmaps and releases this process's hold on the memory (the other side keeps its
        own until it closes too)."""
        if self.closed:
            return
        self.closed = True
        if self.handle < 0:
            return  # emulated: the memory map goes with the last view of it
        cu = _cuda()
        cu.cuMemUnmap(self.ptr, self.size)
        cu.cuMemAddressFree(self.ptr, self.size)
        cu.cuMemRelease(self.handle)

    def tensor(self, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
        """A PyTorch tensor over [offset, offset + nbytes) of the mapping, no copy."""
        import torch
        if offset < 0 or offset + nbytes > self.size:
            raise ShareError(f"a view of {nbytes} bytes at {offset} exceeds the mapping "
                             f"({self.size} bytes)")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=f"cuda:{self.device}")
        if self.handle < 0:
            import numpy as np
            assert self.host is not None
            raw = torch.from_numpy(np.frombuffer(self.host, dtype=np.uint8, count=nbytes,
                                                 offset=offset))
            return raw.view(dtype).reshape(shape)
        raw = torch.as_tensor(_ArrayInterface(self.ptr + offset, nbytes),
                              device=f"cuda:{self.device}")
        return raw.view(dtype).reshape(shape)


@dataclass
class Span:
    """`nbytes` of a mapping at device address `ptr`, or, emulated, its bytes (`host`, a
    numpy uint8 view): what the mlx accused copies its arrays into and out of, with the
    driver (copy_device), PyTorch playing no part."""
    ptr: int
    nbytes: int
    host: Any = None


def span(mapping: Mapping, offset: int, nbytes: int) -> Span:
    if offset < 0 or offset + nbytes > mapping.size:
        raise ShareError(f"a span of {nbytes} bytes at {offset} exceeds the mapping "
                         f"({mapping.size} bytes)")
    if mapping.emulated:
        import numpy as np
        return Span(0, nbytes, np.frombuffer(mapping.host, dtype=np.uint8, count=nbytes,
                                             offset=offset))
    return Span(mapping.ptr + offset, nbytes)


def copy_device(dst: int, src: int, nbytes: int) -> None:
    """Copies `nbytes` from device address `src` to `dst` (either may be managed memory,
    which has one address on the host and the device), complete when this returns."""
    if nbytes <= 0:
        return
    cu = _cuda()
    _check("cuMemcpyDtoD", cu.cuMemcpyDtoD_v2(dst, src, nbytes))
    _check("cuCtxSynchronize", cu.cuCtxSynchronize())


class _ArrayInterface:
    """A bare device byte range for torch.as_tensor (__cuda_array_interface__, version 3)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


def _map(handle: int, size: int, device: int) -> Mapping:
    cu = _cuda()
    ptr = ctypes.c_uint64()
    _check("cuMemAddressReserve", cu.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0))
    try:
        _check("cuMemMap", cu.cuMemMap(ptr.value, size, 0, handle, 0))
        access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, device),
                             CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        _check("cuMemSetAccess", cu.cuMemSetAccess(ptr.value, size, ctypes.byref(access), 1))
    except ShareError:
        cu.cuMemUnmap(ptr.value, size)
        cu.cuMemAddressFree(ptr.value, size)
        raise
    return Mapping(int(ptr.value), size, handle, device)


def create(nbytes: int, device: int = 0) -> tuple[Mapping, int]:
    """A new shareable allocation of at least `nbytes`, mapped here, and a file descriptor
    that exports it (the caller sends it and closes it)."""
    if mode() == "emulate":
        return _emulated(nbytes, device)
    _context(device)
    cu = _cuda()
    g = granularity(device)
    size = max(g, (nbytes + g - 1) // g * g)
    handle = ctypes.c_uint64()
    p = _prop(device)
    _check("cuMemCreate", cu.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(p), 0))
    try:
        mapping = _map(int(handle.value), size, device)
    except ShareError:
        cu.cuMemRelease(handle.value)
        raise
    fd = ctypes.c_int(-1)
    try:
        _check("cuMemExportToShareableHandle", cu.cuMemExportToShareableHandle(
            ctypes.byref(fd), handle.value, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
    except ShareError:
        mapping.close()
        raise
    return mapping, int(fd.value)


def open_shared(fd: int, size: int, device: int = 0, emulated: bool = False) -> Mapping:
    """Maps memory another process exported as `fd` (`size` bytes, as it said; `emulated`
    when the exporter emulates device memory, which it says too); the descriptor is closed
    here, mapped or not."""
    try:
        if emulated:
            return Mapping(0, size, -1, device, host=_host_map(fd, size))
        _context(device)
        cu = _cuda()
        handle = ctypes.c_uint64()
        _check("cuMemImportFromShareableHandle", cu.cuMemImportFromShareableHandle(
            ctypes.byref(handle), ctypes.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    finally:
        os.close(fd)
    try:
        return _map(int(handle.value), size, device)
    except ShareError:
        cu.cuMemRelease(handle.value)
        raise


def _host_map(fd: int, size: int) -> Any:
    import mmap
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _emulated(nbytes: int, device: int) -> tuple[Mapping, int]:
    g = granularity(device)
    size = max(g, (nbytes + g - 1) // g * g)
    fd = os.memfd_create("ksearch-device-share", 0)
    os.ftruncate(fd, size)
    return Mapping(0, size, -1, device, host=_host_map(fd, size)), fd
