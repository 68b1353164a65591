"""Layered confinement for untrusted candidate code: start a command so that, before its first
instruction runs, trusted code has put it in fresh namespaces, a cgroup, resource limits, an
unprivileged uid, a Landlock domain and a seccomp filter, and has reported which of these took.

How a launch goes (Linux):

    caller (judge)  --Popen-->  launcher (this file as a script, stdlib only, single thread)
                                  unshare(pid, mount, net, ipc, uts [, user])
                                  fork --> child = pid 1 of the new PID namespace
                                             private mounts, fresh /proc, private /dev/shm,
                                             hide/reveal directories
                                             join the cgroup(s) the caller made, rlimits
                                             chown workdir, drop to uid/gid 65534
                                             PR_SET_PDEATHSIG, no_new_privs, Landlock,
                                             seccomp stage 1, report --> execve(target)

The caller learns the child's pid (as its own PID namespace numbers it) and the layer report
over a pipe; the report arrives before the target runs, and in ``require`` mode a missing layer
stops the launch with `SandboxUnavailable`. The target may later call `lock_down()` (after its
own imports) to add a second seccomp stage that denies exec and fork-like clones.

Every layer is probed when it is applied, never assumed; a failure lands in the report as an
inactive `Layer` with the reason. On a platform other than Linux (macOS) the module imports, the
launch still runs the command with the resource limits (and the uid drop when root), and every
Linux-only layer is reported unavailable.

Standard library and ctypes only: the launcher runs with ``python -I -S -B`` in environments
without site packages.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (launcher start-up time)
if TYPE_CHECKING:  # the launcher does not import subprocess either
    import subprocess

__all__ = ["Layer", "Policy", "Sandboxed", "SandboxUnavailable", "launch", "lock_down", "probe",
           "interpreter_paths", "closed_ancestor", "LAYER_NAMES"]

IS_LINUX = sys.platform.startswith("linux")
NOBODY = 65534
LAYER_NAMES = ("namespaces", "mounts", "cgroup", "rlimits", "uid", "lifetime", "no_new_privs",
               "landlock", "seccomp")
STARTUP_TIMEOUT_S = 30.0
_CHAR_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SHM_BYTES = 64 << 20

# --- clone/unshare flags -------------------------------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_THREAD = 0x00010000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_NS_FLAGS = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
_CLONE_NS_MASK = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                  | CLONE_NEWPID | CLONE_NEWNET)

# --- mount flags ---------------------------------------------------------------------------------
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

# --- prctl ---------------------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39

# --- seccomp -------------------------------------------------------------------------------------
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
SECCOMP_FILTER_FLAG_SPEC_ALLOW = 4
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
_SECCOMP_NR_OFF = 0
_SECCOMP_ARCH_OFF = 4
_SECCOMP_ARG0_LO_OFF = 16  # args[0], low 32 bits (little-endian)
_EPERM = 1
_ENOSYS = 38

# --- Landlock ------------------------------------------------------------------------------------
LL_EXECUTE = 1 << 0
LL_WRITE_FILE = 1 << 1
LL_READ_FILE = 1 << 2
LL_READ_DIR = 1 << 3
LL_REMOVE_DIR = 1 << 4
LL_REMOVE_FILE = 1 << 5
LL_MAKE_CHAR = 1 << 6
LL_MAKE_DIR = 1 << 7
LL_MAKE_REG = 1 << 8
LL_MAKE_SOCK = 1 << 9
LL_MAKE_FIFO = 1 << 10
LL_MAKE_BLOCK = 1 << 11
LL_MAKE_SYM = 1 << 12
LL_REFER = 1 << 13
LL_TRUNCATE = 1 << 14
LL_IOCTL_DEV = 1 << 15
LL_NET_BIND_TCP = 1 << 0
LL_NET_CONNECT_TCP = 1 << 1
LL_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
LL_SCOPE_SIGNAL = 1 << 1
_LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
_LL_RULE_PATH_BENEATH = 1
_LL_CREATE_RULESET_VERSION = 1


@dataclass(frozen=True)
class _Arch:
    """What the seccomp filter needs to know about one architecture's system-call ABI."""
    audit: int                     # AUDIT_ARCH_* value seccomp_data.arch carries
    foreign_bit: int | None        # a number range of a second ABI on the same arch (x32)
    nr: dict[str, int]


_ARCHES: dict[str, _Arch] = {
    "x86_64": _Arch(0xC000003E, 0x40000000, {
        "socket": 41, "socketpair": 53, "connect": 42, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "process_madvise": 440, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "bpf": 321,
        "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
        "kexec_file_load": 320, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 323, "pidfd_getfd": 438,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "personality": 135,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467, "syslog": 103, "kcmp": 312,
        "lookup_dcookie": 212, "quotactl": 179, "uselib": 134,
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322,
        "seccomp": 317,
    }),
    "aarch64": _Arch(0xC00000B7, None, {
        "socket": 198, "socketpair": 199, "connect": 203, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "process_madvise": 440, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "bpf": 280,
        "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "userfaultfd": 282, "pidfd_getfd": 438,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "personality": 92,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467, "syslog": 116, "kcmp": 272,
        "lookup_dcookie": 18, "quotactl": 60,
        "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "seccomp": 277,
    }),
}
_LANDLOCK_NR = {"create": 444, "add_rule": 445, "restrict_self": 446}  # same on both arches

# System calls stage 1 always answers with EPERM: other processes' memory, namespaces and
# mounts, kernel objects shared across processes, and kernel interfaces with a history of
# exploitable bugs that no kernel needs.
_STAGE1_DENY = ("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "mount",
                "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open",
                "keyctl", "add_key", "request_key", "init_module", "finit_module",
                "delete_module", "kexec_load", "kexec_file_load", "io_uring_setup",
                "io_uring_enter", "io_uring_register", "userfaultfd", "pidfd_getfd",
                "open_by_handle_at", "name_to_handle_at", "personality", "open_tree",
                "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
                "open_tree_attr", "syslog", "kcmp", "lookup_dcookie", "quotactl", "uselib")


class SandboxUnavailable(Exception):
    """A layer the policy requires could not be applied, or the launcher failed before the
    target started. The message names the layer and the reason."""


@dataclass(frozen=True)
class Layer:
    """One confinement layer as it was found: `active` is what the kernel accepted, `detail` says
    what the layer does in this launch or why it is missing."""
    name: str
    active: bool
    detail: str

    def to_json(self) -> dict:
        return {"name": self.name, "active": self.active, "detail": self.detail}

    @staticmethod
    def from_json(obj: dict) -> Layer:
        return Layer(str(obj["name"]), bool(obj["active"]), str(obj["detail"]))


@dataclass(frozen=True)
class Policy:
    """What the confined process may do. Paths are absolute; `workdir` must exist.

    `readable`: read (and, with `allow_exec`, execute) beneath these. `devices`: paths or glob
    patterns (``/dev/nvidia*``) opened read-write with device ioctls. `tasks` bounds threads and
    processes (RLIMIT_NPROC of the sandbox uid and the cgroup's pids.max). `socket_families`:
    address families (e.g. ``socket.AF_UNIX``) that socket()/socketpair() may still create.
    `uid`/`gid`: what a root caller drops to. `reveal`: paths the sandbox uid must reach
    although an ancestor directory is closed to it (a virtualenv's base interpreter under a
    0700 /root, see `interpreter_paths`): inside the sandbox's mount namespace the first closed
    ancestor is covered by a read-only tmpfs holding read-only bind mounts of just these paths,
    so the rest of that directory stays hidden. `hide`: directories covered by an empty
    read-only tmpfs inside the sandbox (e.g. /run and /var/run, whose world-writable unix
    sockets an AF_UNIX-enabled sandbox could otherwise connect to); the workdir must not be
    beneath one. `proc_writable`: allow writing files beneath
    the sandbox's private /proc (only its own processes are there; the CUDA driver names its
    threads through /proc/self/task/*/comm and cuInit fails without it); never granted on the
    host's /proc. `mode`: ``best-effort`` reports a missing layer
    and runs anyway; ``require`` raises `SandboxUnavailable` before the target starts.
    """
    workdir: str
    readable: tuple[str, ...] = ("/",)
    devices: tuple[str, ...] = ()
    address_space_bytes: int | None = None
    memory_bytes: int | None = None
    cpu_seconds: int | None = None
    file_bytes: int | None = None
    open_files: int | None = 1024
    tasks: int | None = None
    allow_exec: bool = False
    allow_fork: bool = False
    mode: str = "best-effort"
    socket_families: tuple[int, ...] = ()
    uid: int = NOBODY
    gid: int = NOBODY
    reveal: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    proc_writable: bool = False

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(obj: dict) -> Policy:
        known = {f.name for f in dataclasses.fields(Policy)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in obj.items() if k in known}
        return Policy(**kw)


def _needed(name: str, policy: Policy) -> bool:
    """Whether a missing layer counts as missing in `require` mode. The cgroup is only needed
    for the limits that live there; every other layer is always part of the sandbox."""
    if name == "cgroup":
        return policy.memory_bytes is not None or policy.tasks is not None
    return True


# =================================================================================================
# libc access (ctypes)
# =================================================================================================

_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _oserror(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _c_arg(a: object) -> object:
    """Variadic libc functions (syscall, prctl) need every integer widened to a machine word."""
    if isinstance(a, int):
        return ctypes.c_ulong(a & ((1 << 64) - 1))
    return a


def _syscall(nr: int, *args: object) -> int:
    fn = _libc().syscall
    fn.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = fn(ctypes.c_long(nr), *[_c_arg(a) for a in args])
    if rc == -1:
        raise _oserror(f"syscall {nr}")
    return rc


def _prctl(option: int, a2: int = 0, a3: object = 0, a4: int = 0, a5: int = 0) -> int:
    fn = _libc().prctl
    fn.restype = ctypes.c_int
    rc = fn(ctypes.c_int(option), _c_arg(a2), _c_arg(a3), _c_arg(a4), _c_arg(a5))
    if rc == -1:
        raise _oserror(f"prctl({option})")
    return rc


def _unshare(flags: int) -> None:
    fn = _libc().unshare
    fn.argtypes = [ctypes.c_int]
    if fn(flags) != 0:
        raise _oserror("unshare")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    fn = _libc().mount
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                   ctypes.c_char_p]
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()
    if fn(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise _oserror(f"mount {target}")


def _machine() -> str:
    return os.uname().machine


def syscall_number(name: str) -> int | None:
    """The number of system call `name` on this machine's architecture (among those the filter
    knows), or None."""
    arch = _ARCHES.get(_machine())
    return None if arch is None else arch.nr.get(name)


def _status_field(name: str) -> str:
    """A field of /proc/self/status, '' when absent (how the kernel reports what it applied)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return ""
    return ""


# =================================================================================================
# seccomp: a classic BPF program built here, no libseccomp
# =================================================================================================

class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_Insn = tuple[int, int, int, int]


def _stmt(code: int, k: int) -> _Insn:
    return (code, 0, 0, k & 0xFFFFFFFF)


def _jump(code: int, k: int, jt: int, jf: int) -> _Insn:
    return (code, jt, jf, k & 0xFFFFFFFF)


def _ret_errno(err: int) -> _Insn:
    return _stmt(_BPF_RET_K, SECCOMP_RET_ERRNO | err)


def _family_block(nr: int, families: tuple[int, ...]) -> list[_Insn]:
    """socket()/socketpair(): allow the listed address families (args[0]), EPERM for others."""
    body: list[_Insn] = [_stmt(_BPF_LD_W_ABS, _SECCOMP_ARG0_LO_OFF)]
    for fam in families:
        body += [_jump(_BPF_JEQ_K, fam, 0, 1), _stmt(_BPF_RET_K, SECCOMP_RET_ALLOW)]
    body.append(_ret_errno(_EPERM))
    return [_jump(_BPF_JEQ_K, nr, 0, len(body))] + body


def _clone_block(nr: int, allow_processes: bool, allow_threads: bool) -> list[_Insn]:
    """clone(): namespace flags always EPERM; CLONE_THREAD (a thread) allowed when
    `allow_threads`; anything else (a new process) allowed only when `allow_processes`."""
    other = SECCOMP_RET_ALLOW if allow_processes else SECCOMP_RET_ERRNO | _EPERM
    thread = SECCOMP_RET_ALLOW if allow_threads else SECCOMP_RET_ERRNO | _EPERM
    body = [_stmt(_BPF_LD_W_ABS, _SECCOMP_ARG0_LO_OFF),
            _jump(_BPF_JSET_K, _CLONE_NS_MASK, 0, 1),
            _ret_errno(_EPERM),
            _jump(_BPF_JSET_K, CLONE_THREAD, 0, 1),
            _stmt(_BPF_RET_K, thread),
            _stmt(_BPF_RET_K, other)]
    return [_jump(_BPF_JEQ_K, nr, 0, len(body))] + body


def _seccomp_program(arch: _Arch, deny: dict[str, int], *, families: tuple[int, ...] | None,
                     clone: tuple[bool, bool] | None) -> list[_Insn]:
    """The whole filter: kill on a foreign architecture or the x32 range, `deny` name -> errno,
    socket families when `families` is given, the clone rule when `clone` is given, allow the
    rest. Unknown names on this arch (fork on aarch64) are skipped."""
    prog: list[_Insn] = [_stmt(_BPF_LD_W_ABS, _SECCOMP_ARCH_OFF),
                         _jump(_BPF_JEQ_K, arch.audit, 1, 0),
                         _stmt(_BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
                         _stmt(_BPF_LD_W_ABS, _SECCOMP_NR_OFF)]
    if arch.foreign_bit is not None:
        prog += [_jump(_BPF_JGE_K, arch.foreign_bit, 0, 1),
                 _stmt(_BPF_RET_K, SECCOMP_RET_KILL_PROCESS)]
    for name, err in deny.items():
        if name in arch.nr:
            prog += [_jump(_BPF_JEQ_K, arch.nr[name], 0, 1), _ret_errno(err)]
    if families is not None:
        prog += _family_block(arch.nr["socket"], families)
        prog += _family_block(arch.nr["socketpair"], families)
    if clone is not None:
        prog += _clone_block(arch.nr["clone"], *clone)
    prog.append(_stmt(_BPF_RET_K, SECCOMP_RET_ALLOW))
    return prog


def _install_seccomp(prog: list[_Insn], arch: _Arch, tsync: bool) -> str:
    """Load `prog` with the seccomp syscall (TSYNC: every thread of the process; SPEC_ALLOW: keep
    the speculation settings timing was measured under), falling back to prctl. Needs
    no_new_privs or CAP_SYS_ADMIN. Returns how it was installed; raises OSError."""
    arr = (_SockFilter * len(prog))(*[_SockFilter(*insn) for insn in prog])
    fprog = _SockFprog(len(prog), arr)
    flags = (SECCOMP_FILTER_FLAG_TSYNC if tsync else 0) | SECCOMP_FILTER_FLAG_SPEC_ALLOW
    try:
        rc = _syscall(arch.nr["seccomp"], SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog))
        if rc != 0:
            raise OSError(0, f"seccomp TSYNC failed: thread {rc} has a diverging filter")
        return "seccomp(2)" + (" TSYNC" if tsync else "")
    except OSError as e:
        if e.errno not in (_ENOSYS, 22):  # EINVAL: an older kernel without SPEC_ALLOW
            raise
    if tsync:
        _syscall(arch.nr["seccomp"], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                 ctypes.byref(fprog))
        return "seccomp(2) TSYNC"
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog))
    return "prctl(PR_SET_SECCOMP)"


def _stage1_rules(policy: Policy) -> dict[str, int]:
    deny = {name: _EPERM for name in _STAGE1_DENY}
    deny["clone3"] = _ENOSYS  # flags live in memory seccomp cannot read; glibc falls back to clone
    if not policy.allow_fork:
        deny["fork"] = _EPERM
        deny["vfork"] = _EPERM
    if not policy.allow_exec:
        deny["execveat"] = _EPERM
    return deny


def _seccomp_stage1(policy: Policy) -> Layer:
    """Stage 1, installed just before execve (which it must allow)."""
    if not IS_LINUX:
        return Layer("seccomp", False, "unavailable: not Linux")
    arch = _ARCHES.get(_machine())
    if arch is None:
        return Layer("seccomp", False, f"unavailable: no system-call table for {_machine()}")
    prog = _seccomp_program(arch, _stage1_rules(policy), families=policy.socket_families,
                            clone=(policy.allow_fork, True))
    try:
        how = _install_seccomp(prog, arch, tsync=False)
    except OSError as e:
        return Layer("seccomp", False, f"filter not installed: {e}")
    mode = _status_field("Seccomp")
    if mode != "2":
        return Layer("seccomp", False, f"installed via {how} but /proc/self/status says "
                                       f"Seccomp: {mode!r}")
    fams = ", ".join(str(f) for f in policy.socket_families) or "none"
    return Layer("seccomp", True,
                 f"stage 1 ({_machine()}, {len(prog)} instructions, {how}): foreign arch"
                 f"{' and x32' if arch.foreign_bit else ''} -> kill; EPERM for socket/socketpair "
                 f"(families allowed: {fams}), ptrace, process_vm_*, mount family, "
                 f"unshare/setns, bpf, perf_event_open, keyrings, modules, kexec, io_uring, "
                 f"userfaultfd, pidfd_getfd, *_by_handle_at, personality; clone with namespace "
                 f"flags; fork-like clone {'allowed' if policy.allow_fork else 'EPERM'}; "
                 f"clone3 ENOSYS; execveat {'allowed' if policy.allow_exec else 'EPERM'}; "
                 f"execve allowed until lock_down()")


def lock_down(allow_threads: bool = True) -> Layer:
    """Seccomp stage 2, called by the confined process itself once its imports are done: from
    here on execve/execveat and fork-like clones fail with EPERM (clone3 with ENOSYS), and so do
    socket, socketpair and connect (the unix sockets stage 1 leaves to GPU backends are for the
    CUDA driver's start-up, which is over by now; sockets already open, such as the channel to
    the judge, keep working); threads (clone with CLONE_THREAD) stay allowed unless
    `allow_threads` is false. The filter stacks on stage 1 and covers every thread of the
    process (TSYNC), including pools started by the imports. Sets no_new_privs first
    (unprivileged processes need it to install a filter)."""
    if not IS_LINUX:
        return Layer("lockdown", False, "unavailable: not Linux")
    arch = _ARCHES.get(_machine())
    if arch is None:
        return Layer("lockdown", False, f"unavailable: no system-call table for {_machine()}")
    deny = {"execve": _EPERM, "execveat": _EPERM, "fork": _EPERM, "vfork": _EPERM,
            "clone3": _ENOSYS, "socket": _EPERM, "socketpair": _EPERM, "connect": _EPERM}
    prog = _seccomp_program(arch, deny, families=None, clone=(False, allow_threads))
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        how = _install_seccomp(prog, arch, tsync=True)
    except OSError as e:
        return Layer("lockdown", False, f"stage 2 not installed: {e}")
    return Layer("lockdown", True,
                 f"stage 2 ({len(prog)} instructions, {how}): execve/execveat EPERM, fork/vfork "
                 f"and fork-like clone EPERM, clone3 ENOSYS, socket/socketpair/connect "
                 f"EPERM, threads "
                 f"{'allowed' if allow_threads else 'EPERM'}")


# =================================================================================================
# Landlock
# =================================================================================================

def landlock_abi() -> int:
    """The Landlock ABI version the running kernel offers; 0 when there is none."""
    if not IS_LINUX or _machine() not in _ARCHES:
        return 0
    try:
        return _syscall(_LANDLOCK_NR["create"], 0, 0, _LL_CREATE_RULESET_VERSION)
    except OSError:
        return 0


def _landlock_handled(abi: int) -> tuple[int, int, int]:
    """(fs, net, scoped) access rights the ABI knows; a ruleset handles exactly these."""
    fs = (LL_MAKE_SYM << 1) - 1
    if abi >= 2:
        fs |= LL_REFER
    if abi >= 3:
        fs |= LL_TRUNCATE
    if abi >= 5:
        fs |= LL_IOCTL_DEV
    net = (LL_NET_BIND_TCP | LL_NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL) if abi >= 6 else 0
    return fs, net, scoped


@dataclass
class _Ruleset:
    """A Landlock ruleset built (as root, so every path can be opened) but not yet enforced."""
    fd: int
    abi: int
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _landlock_add(rs: _Ruleset, handled_fs: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        rs.skipped.append(f"{path} ({e.strerror})")
        return
    try:
        if not os.path.isdir(path):
            rights &= _LL_FILE_RIGHTS
        rights &= handled_fs
        attr = ctypes.create_string_buffer(struct.pack("<Qi", rights, fd), 12)
        _syscall(_LANDLOCK_NR["add_rule"], rs.fd, _LL_RULE_PATH_BENEATH, attr, 0)
    except OSError as e:
        rs.skipped.append(f"{path} ({e.strerror})")
    finally:
        os.close(fd)


def _expand_devices(patterns: tuple[str, ...]) -> list[str]:
    """Device rules as paths: a glob (``/dev/nvidia*``) expands to what exists now, a path that
    does not exist counts as a prefix (``/dev/nvidia`` means ``/dev/nvidia*``)."""
    import glob
    out: list[str] = []
    for pat in patterns:
        if glob.has_magic(pat):
            out += sorted(glob.glob(pat))
        elif os.path.exists(pat):
            out.append(pat)
        else:
            out += sorted(glob.glob(glob.escape(pat) + "*"))
    return out


def _landlock_prepare(policy: Policy, exec_files: list[str], private_shm: bool,
                      private_proc: bool) -> tuple[_Ruleset | None, str]:
    """Create the ruleset: read (+execute with allow_exec) beneath `readable`, everything but
    execute (unless allowed) and device nodes beneath `workdir`, read-write+ioctl on `devices`,
    read-write on the harmless character devices and a private /dev/shm, execute on
    `exec_files` only (the target and its interpreters) when exec is not allowed."""
    abi = landlock_abi()
    if abi < 1:
        return None, "unavailable: the kernel offers no Landlock ABI"
    fs, net, scoped = _landlock_handled(abi)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    attr = ctypes.create_string_buffer(struct.pack("<QQQ", fs, net, scoped)[:size], size)
    try:
        rs = _Ruleset(_syscall(_LANDLOCK_NR["create"], attr, size, 0), abi)
    except OSError as e:
        return None, f"ruleset not created: {e}"
    read = LL_READ_FILE | LL_READ_DIR | (LL_EXECUTE if policy.allow_exec else 0)
    write_all = fs & ~(LL_MAKE_CHAR | LL_MAKE_BLOCK)
    if not policy.allow_exec:
        write_all &= ~LL_EXECUTE
    dev_rw = LL_READ_FILE | LL_WRITE_FILE | LL_TRUNCATE
    for p in (*policy.readable, *policy.reveal):  # what must be reached must be readable
        _landlock_add(rs, fs, p, read)
    _landlock_add(rs, fs, policy.workdir, write_all)
    devices = _expand_devices(policy.devices)
    for p in devices:
        _landlock_add(rs, fs, p, dev_rw | LL_IOCTL_DEV | LL_READ_DIR)
    for p in _CHAR_DEVICES:
        _landlock_add(rs, fs, p, dev_rw)
    if private_shm:
        _landlock_add(rs, fs, "/dev/shm", write_all & ~LL_EXECUTE)
    proc_rw = policy.proc_writable and private_proc
    if proc_rw:
        _landlock_add(rs, fs, "/proc", LL_WRITE_FILE | LL_TRUNCATE)
    if not policy.allow_exec:
        for p in exec_files:
            _landlock_add(rs, fs, p, LL_EXECUTE | LL_READ_FILE)
    parts = [f"ABI {abi}", f"read{'+exec' if policy.allow_exec else ''} beneath "
             f"{', '.join(policy.readable)}", f"read-write beneath {policy.workdir}"]
    if devices:
        parts.append(f"read-write{'+ioctl' if abi >= 5 else ''} on {', '.join(devices)}")
    parts.append("read-write on " + ", ".join(_CHAR_DEVICES + (("/dev/shm",) if private_shm
                                                               else ())))
    if policy.proc_writable:
        parts.append("write beneath the private /proc" if proc_rw
                     else "proc_writable refused: /proc is the host's")
    parts.append("exec: " + ("anything readable" if policy.allow_exec
                             else "only " + ", ".join(exec_files)))
    parts.append("tcp bind/connect denied" if net else "no network rights (ABI < 4)")
    parts.append("signals and abstract unix sockets scoped to the sandbox" if scoped
                 else "no scoping (ABI < 6)")
    if rs.skipped:
        parts.append("rules skipped: " + "; ".join(rs.skipped))
    return rs, "; ".join(parts)


def _landlock_enforce(rs: _Ruleset | None, detail: str) -> Layer:
    if rs is None:
        return Layer("landlock", False, detail)
    try:
        _syscall(_LANDLOCK_NR["restrict_self"], rs.fd, 0)
    except OSError as e:
        return Layer("landlock", False, f"restrict_self failed: {e}")
    finally:
        os.close(rs.fd)
    return Layer("landlock", True, detail)


def _elf_interpreter(path: str) -> str | None:
    """PT_INTERP of a 64-bit little-endian ELF file (the dynamic loader the kernel opens for
    execve, which therefore needs the execute right too); None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                ph = f.read(56)
                if len(ph) < 56:
                    return None
                p_type, = struct.unpack_from("<I", ph, 0)
                if p_type == 3:
                    off, = struct.unpack_from("<Q", ph, 8)
                    size, = struct.unpack_from("<Q", ph, 32)
                    f.seek(off)
                    return f.read(size).rstrip(b"\0").decode()
    except (OSError, UnicodeDecodeError, struct.error):
        return None
    return None


def _exec_chain(path: str) -> list[str]:
    """Files execve(path) makes the kernel open for execution: the file, a #! interpreter and
    the ELF interpreters (real paths, since Landlock rules bind inodes)."""
    out: list[str] = []
    todo = [path]
    while todo and len(out) < 6:
        p = os.path.realpath(todo.pop())
        if p in out:
            continue
        out.append(p)
        try:
            with open(p, "rb") as f:
                first = f.read(256)
        except OSError:
            continue
        if first.startswith(b"#!"):
            words = first[2:].split(b"\n", 1)[0].split()
            if words:
                todo.append(words[0].decode(errors="replace"))
            continue
        interp = _elf_interpreter(p)
        if interp:
            todo.append(interp)
    return out


# =================================================================================================
# cgroups (made by the caller, joined by the child, removed by the caller)
# =================================================================================================

@dataclass
class _CgroupPlan:
    """Cgroup directories made for one launch, and what could not be done."""
    dirs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _cgroup_mounts() -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """v1 controller -> (mount point, mount root) and the v2 (mount point, mount root)."""
    v1: dict[str, tuple[str, str]] = {}
    v2: tuple[str, str] | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            a, b = pre.split(), post.split()
            if len(a) < 5 or len(b) < 3:
                continue
            root, mnt = a[3], a[4]
            if b[0] == "cgroup2" and v2 is None:
                v2 = (mnt, root)
            elif b[0] == "cgroup":
                for opt in b[2].split(","):
                    v1.setdefault(opt, (mnt, root))
    return v1, v2


def _own_cgroups() -> tuple[dict[str, str], str | None]:
    v1: dict[str, str] = {}
    v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and ctrls == "":
                v2 = path
            for c in ctrls.split(","):
                if c:
                    v1[c] = path
    return v1, v2


def _cg_dir(mount: tuple[str, str], path: str) -> str:
    mnt, root = mount
    if root != "/" and path.startswith(root):
        path = path[len(root):]
    return os.path.join(mnt, path.lstrip("/"))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


_CG_PREFIX = "ksearch-sandbox-"


def _sweep_stale(base: str) -> None:
    """Remove empty groups that an earlier caller made and could not remove because it died
    (named ksearch-sandbox-<its pid>-<random>, and that pid is gone). A group still holding
    processes refuses rmdir and stays."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(_CG_PREFIX)]
    except OSError:
        return
    for n in names:
        pid = n[len(_CG_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(base, n))
            except OSError:
                continue  # not empty, or raced with another sweeper: leave it


def _v1_group(plan: _CgroupPlan, base: str, name: str, limits: dict[str, int | None]) -> None:
    _sweep_stale(base)
    d = os.path.join(base, name)
    os.mkdir(d)
    plan.dirs.append(d)
    for fname, val in limits.items():
        if val is not None and os.path.exists(os.path.join(d, fname)):
            _write(os.path.join(d, fname), str(val))
            plan.notes.append(f"{fname}={val}")


def _v2_parent(mount: tuple[str, str], own: str, want: set[str]) -> str:
    """The nearest group at or above ours whose children get `want` controllers, enabling them
    on our own group when no ancestor delegates them (fails with EBUSY where the no-internal-
    processes rule forbids it)."""
    cur = own
    while True:
        d = _cg_dir(mount, cur)
        try:
            with open(os.path.join(d, "cgroup.subtree_control")) as f:
                have = set(f.read().split())
        except OSError:
            have = set()
        if want <= have:
            return d
        if cur in ("", "/"):
            break
        cur = os.path.dirname(cur)
    d = _cg_dir(mount, own)
    _write(os.path.join(d, "cgroup.subtree_control"), " ".join("+" + c for c in sorted(want)))
    return d


def _make_cgroups(policy: Policy) -> _CgroupPlan:
    """Make a memory and a pids group for one launch (v1 hierarchies where those controllers are
    mounted, else one v2 group) with the policy's limits. Not being root or finding no
    controller is recorded, not raised."""
    plan = _CgroupPlan()
    if not IS_LINUX:
        plan.missing.append("not Linux")
        return plan
    name = f"{_CG_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    mem = policy.memory_bytes
    limits = {"memory": {"memory.limit_in_bytes": mem, "memory.memsw.limit_in_bytes": mem},
              "pids": {"pids.max": policy.tasks}}
    try:
        mounts_v1, mount_v2 = _cgroup_mounts()
        own_v1, own_v2 = _own_cgroups()
    except OSError as e:
        plan.missing.append(f"cannot read cgroup mounts: {e}")
        return plan
    v2_want: set[str] = set()
    for ctrl in ("memory", "pids"):
        if ctrl in mounts_v1 and ctrl in own_v1:
            try:
                _v1_group(plan, _cg_dir(mounts_v1[ctrl], own_v1[ctrl]), name, limits[ctrl])
                plan.notes.append(f"v1 {ctrl}")
            except OSError as e:
                plan.missing.append(f"v1 {ctrl}: {e}")
        else:
            v2_want.add(ctrl)
    if v2_want:
        _make_v2_group(plan, policy, mount_v2, own_v2, v2_want, name)
    return plan


def _make_v2_group(plan: _CgroupPlan, policy: Policy, mount: tuple[str, str] | None,
                   own: str | None, want: set[str], name: str) -> None:
    if mount is None or own is None:
        plan.missing.append(f"{'/'.join(sorted(want))}: no cgroup hierarchy has it")
        return
    try:
        with open(os.path.join(mount[0], "cgroup.controllers")) as f:
            offered = set(f.read().split())
        if not want <= offered:
            plan.missing.append(f"v2 lacks {' '.join(sorted(want - offered))}")
            want = want & offered
            if not want:
                return
        parent = _v2_parent(mount, own, want)
        _sweep_stale(parent)
        d = os.path.join(parent, name)
        os.mkdir(d)
        plan.dirs.append(d)
        vals = {"memory.max": policy.memory_bytes,
                "memory.swap.max": 0 if policy.memory_bytes is not None else None,
                "memory.oom.group": 1, "pids.max": policy.tasks}
        for fname, val in vals.items():
            if val is not None and os.path.exists(os.path.join(d, fname)):
                _write(os.path.join(d, fname), str(val))
                plan.notes.append(f"{fname}={val}")
        plan.notes.append(f"v2 {' '.join(sorted(want))}")
    except OSError as e:
        plan.missing.append(f"v2 {' '.join(sorted(want))}: {e}")


def _cgroup_pids(d: str) -> list[int]:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _remove_cgroups(dirs: list[str], deadline_s: float = 2.0) -> list[str]:
    """Kill what is left in the groups (nothing, once the namespace init is reaped) and remove
    them; returns the directories that could not be removed."""
    left: list[str] = []
    for d in dirs:
        end = time.monotonic() + deadline_s
        while True:
            for pid in _cgroup_pids(d):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass  # already gone
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > end:
                    left.append(d)
                    break
                time.sleep(0.01)
    return left


def _join_cgroups(plan: dict, policy: Policy) -> Layer:
    joined: list[str] = []
    errors: list[str] = list(plan["missing"])
    for d in plan["dirs"]:
        try:
            _write(os.path.join(d, "cgroup.procs"), "0")
            joined.append(d)
        except OSError as e:
            errors.append(f"join {d}: {e.strerror}")
    wanted = []
    if policy.memory_bytes is not None:
        wanted.append(f"memory {policy.memory_bytes} B")
    if policy.tasks is not None:
        wanted.append(f"pids {policy.tasks}")
    what = ", ".join(wanted) or "no limits requested (accounting and kill-all only)"
    if errors or not joined:
        return Layer("cgroup", False, f"unavailable ({what}): " + ("; ".join(errors)
                                                                  or "no group made"))
    return Layer("cgroup", True, f"{what}; joined {', '.join(joined)} "
                                 f"({', '.join(plan['notes'])})")


# =================================================================================================
# The launcher and the child (run as `python -I -S -B sandbox.py --config-fd N --status-fd M`)
# =================================================================================================

def _send(fd: int, obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def _ns_ids() -> dict[str, str]:
    out = {}
    for ns in ("pid_for_children", "mnt", "net", "ipc", "uts", "user"):
        try:
            out[ns] = os.readlink(f"/proc/self/ns/{ns}")
        except OSError:
            out[ns] = ""
    return out


def _enter_namespaces() -> tuple[Layer, bool]:
    """unshare pid+mount+net+ipc+uts; a non-root caller (no CAP_SYS_ADMIN) adds a user namespace
    that maps only its own uid/gid (so the target has no capabilities once it executes). Verified by
    comparing /proc/self/ns before and after. Returns the layer and whether a user ns is used."""
    if not IS_LINUX:
        return Layer("namespaces", False, "unavailable: not Linux"), False
    before = _ns_ids()
    userns = False
    try:
        _unshare(_NS_FLAGS)
    except OSError as first:
        uid, gid = os.getuid(), os.getgid()
        if uid == 0:
            # A user namespace mapping only root would leave the target root on the host's
            # root-owned files and make the uid drop impossible: no namespaces instead.
            return Layer("namespaces", False, f"unshare failed: {first} (a root caller gets no "
                                              f"user-namespace fallback)"), False
        try:
            _unshare(_NS_FLAGS | CLONE_NEWUSER)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            userns = True
        except OSError as second:
            return Layer("namespaces", False, f"unshare failed: {first}; with a user namespace: "
                                              f"{second}"), False
    after = _ns_ids()
    # pid_for_children reads as absent until the namespace has its init; the child checks
    # that it is pid 1 instead.
    same = [ns for ns in ("mnt", "net", "ipc", "uts") if before[ns] == after[ns] or not after[ns]]
    if after["pid_for_children"] and after["pid_for_children"] == before["pid_for_children"]:
        same.append("pid")
    if userns and before["user"] == after["user"]:
        same.append("user")
    if same:
        return Layer("namespaces", False, f"unshare returned but unchanged: {', '.join(same)}"
                     ), userns
    names = "pid, mount, net, ipc, uts" + (", user (own uid mapped)" if userns else "")
    return Layer("namespaces", True, f"new {names}; the target is pid 1 of its PID namespace"
                 ), userns


def _private_mounts(ns: Layer) -> tuple[Layer, bool]:
    """Mounts private (nothing propagates back), a fresh /proc that shows only the sandbox's own
    processes, a private tmpfs on /dev/shm. Returns the layer and whether /dev/shm is private."""
    if not ns.active:
        return Layer("mounts", False, "unavailable: no mount/PID namespace"), False
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as e:
        return Layer("mounts", False, f"fresh /proc not mounted: {e}"), False
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    if pids != [1]:
        return Layer("mounts", False, f"/proc still lists pids {pids[:8]}"), False
    shm = "/dev/shm not private (absent)"
    private_shm = False
    if os.path.isdir("/dev/shm"):
        try:
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   f"size={_SHM_BYTES},mode=1777")
            shm, private_shm = f"private /dev/shm ({_SHM_BYTES >> 20} MiB tmpfs)", True
        except OSError as e:
            shm = f"/dev/shm not private: {e}"
    return Layer("mounts", True, f"mounts private; fresh /proc lists only pid 1; {shm}"
                 ), private_shm


def closed_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The first directory on the way to `path` (from /) that `uid`/`gid` without supplementary
    groups may not search, by its mode bits; None when every one is searchable."""
    parts = os.path.realpath(path).split("/")[1:]
    cur = "/"
    for part in [""] + parts[:-1]:
        cur = os.path.join(cur, part) if part else cur
        try:
            st = os.stat(cur)
        except OSError:
            return cur
        bits = st.st_mode >> 6 if st.st_uid == uid else (
            st.st_mode >> 3 if st.st_gid == gid else st.st_mode)
        if not bits & 1:
            return cur
    return None


def interpreter_paths(prefixes: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """What a confined copy of this interpreter needs to reach: sys.prefix, sys.exec_prefix and
    sys.base_prefix (a virtualenv and the installation it was made from). Feed to
    `Policy.reveal`."""
    if prefixes is None:
        prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    out: list[str] = []
    for p in prefixes:
        real = os.path.realpath(p)
        if real not in out:
            out.append(real)
    return tuple(out)


def _reveal(policy: Policy, mounts: Layer) -> tuple[Layer, str]:
    """Make `policy.reveal` reachable for the sandbox uid (see Policy). Returns the mounts layer
    (made inactive when a reveal fails) and a note for the report."""
    uid, gid = (policy.uid, policy.gid) if os.getuid() == 0 else (os.getuid(), os.getgid())
    groups: dict[str, list[tuple[str, int]]] = {}
    notes: list[str] = []
    for p in policy.reveal:
        real = os.path.realpath(p)
        blocker = closed_ancestor(real, uid, gid) if os.path.exists(real) else None
        if blocker is None:
            continue  # reachable already (or absent: nothing to show)
        if not mounts.active:
            return (Layer("mounts", False, f"{mounts.detail}; cannot reveal {real}: no mount "
                                           f"namespace"), "")
        groups.setdefault(blocker, []).append((real, os.open(real, os.O_PATH | os.O_CLOEXEC)))
    try:
        for blocker, items in groups.items():
            _mount("tmpfs", blocker, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for real, fd in items:
                _bind_readonly(fd, real)
            _mount(None, blocker, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            notes.append(f"{blocker} replaced by a read-only view of "
                         f"{', '.join(r for r, _ in items)}")
    except OSError as e:
        return Layer("mounts", False, f"{mounts.detail}; reveal failed: {e}"), ""
    finally:
        for items in groups.values():
            for _, fd in items:
                os.close(fd)
    return mounts, "; ".join(notes)


def _hide(policy: Policy, mounts: Layer) -> tuple[Layer, str]:
    """Cover each `policy.hide` directory with an empty read-only tmpfs (private mount
    namespace only). Returns the mounts layer (inactive when a hide fails) and a note."""
    done: list[str] = []
    for p in policy.hide:
        if not os.path.isdir(p):
            continue  # nothing there to hide
        if not mounts.active:
            return Layer("mounts", False, f"{mounts.detail}; cannot hide {p}: no mount "
                                          f"namespace"), ""
        try:
            _mount("tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   "size=4k,mode=0755")
        except OSError as e:
            return Layer("mounts", False, f"{mounts.detail}; hiding {p} failed: {e}"), ""
        done.append(p)
    return mounts, ("hidden: " + ", ".join(done)) if done else ""


def _bind_readonly(fd: int, dst: str) -> None:
    is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
    os.makedirs(dst if is_dir else os.path.dirname(dst), mode=0o755, exist_ok=True)
    if not is_dir:
        open(dst, "a").close()
    _mount(f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _rlimits(policy: Policy) -> Layer:
    import resource
    want = [("RLIMIT_CORE", 0), ("RLIMIT_AS", policy.address_space_bytes),
            ("RLIMIT_CPU", policy.cpu_seconds), ("RLIMIT_FSIZE", policy.file_bytes),
            ("RLIMIT_NOFILE", policy.open_files), ("RLIMIT_NPROC", policy.tasks)]
    done, failed = [], []
    for name, val in want:
        if val is None:
            continue
        res = getattr(resource, name, None)
        if res is None:
            failed.append(f"{name}: not on this platform")
            continue
        try:
            resource.setrlimit(res, (val, val))
            if resource.getrlimit(res) != (val, val):
                raise OSError(0, f"reads back {resource.getrlimit(res)}")
            done.append(f"{name[7:]}={val}")
        except (OSError, ValueError) as e:
            failed.append(f"{name}: {e}")
    detail = "soft=hard " + ", ".join(done)
    if failed:
        return Layer("rlimits", False, detail + "; failed: " + "; ".join(failed))
    return Layer("rlimits", True, detail)


def _drop_uid(policy: Policy) -> Layer:
    """A root caller: hand the workdir (the directory itself) to the sandbox uid, clear the
    supplementary groups, set real/effective/saved gid and uid, and confirm that no capability
    is left. A non-root caller is already unprivileged."""
    if os.getuid() != 0:
        return Layer("uid", True, f"runs as uid {os.getuid()} (the caller's, not root)")
    uid, gid = policy.uid, policy.gid
    try:
        os.chown(policy.workdir, uid, gid)
        os.setgroups([])
        if hasattr(os, "setresuid"):
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        else:  # macOS: as root, setgid/setuid set the real, effective and saved ids
            os.setgid(gid)
            os.setuid(uid)
    except OSError as e:
        return Layer("uid", False, f"drop to {uid}:{gid} failed: {e}")
    ids = (os.getuid(), os.geteuid(), os.getgid(), os.getegid())
    if ids != (uid, uid, gid, gid) or (hasattr(os, "getresuid") and (
            os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid))):
        return Layer("uid", False, f"ids read back {ids}")
    cap = _status_field("CapEff") if IS_LINUX else ""
    if IS_LINUX and cap.strip("0"):
        return Layer("uid", False, f"dropped to {uid} but CapEff is {cap}")
    if not os.access(policy.workdir, os.W_OK | os.X_OK):
        return Layer("uid", False, f"uid {uid} cannot write {policy.workdir} (a parent "
                                   f"directory is not searchable?)")
    caps = "no capabilities (CapEff 0)" if IS_LINUX else "capabilities not checked"
    return Layer("uid", True, f"uid/gid {uid}/{gid}, no supplementary groups, {caps}; "
                              f"workdir owned by {uid}")


def _arm_parent_death(lifeline: int) -> Layer:
    """PR_SET_PDEATHSIG(SIGKILL) after the uid change (which clears it), then make sure the
    launcher did not already die: its end of the lifeline pipe closes when it does."""
    if not IS_LINUX:
        return Layer("lifetime", False, "unavailable: no PR_SET_PDEATHSIG (not Linux); new "
                                        "session only, Sandboxed.kill() kills the group")
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        got = ctypes.c_int(0)
        _prctl(PR_GET_PDEATHSIG, ctypes.addressof(got))
    except OSError as e:
        return Layer("lifetime", False, f"PR_SET_PDEATHSIG failed: {e}")
    if select.select([lifeline], [], [], 0)[0]:
        os._exit(137)  # the launcher is gone; nobody would reap or kill us
    if got.value != signal.SIGKILL:
        return Layer("lifetime", False, f"PR_GET_PDEATHSIG reads {got.value}")
    return Layer("lifetime", True, "SIGKILL when the launcher dies, which gets SIGKILL when the "
                                   "caller's spawning thread dies; new session (no controlling "
                                   "terminal)")


def _no_new_privs() -> Layer:
    if not IS_LINUX:
        return Layer("no_new_privs", False, "unavailable: not Linux")
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if _prctl(PR_GET_NO_NEW_PRIVS) != 1:
            return Layer("no_new_privs", False, "PR_GET_NO_NEW_PRIVS reads 0")
    except OSError as e:
        return Layer("no_new_privs", False, str(e))
    return Layer("no_new_privs", True, "set-uid/file capabilities ignored on execve")


def _resolve(prog: str, env: dict[str, str]) -> str:
    if "/" in prog:
        return os.path.abspath(prog)
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        cand = os.path.join(d or ".", prog)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    raise FileNotFoundError(2, f"{prog!r} not found on PATH")


def _child(cfg: dict, ns: Layer, status_fd: int, lifeline: int) -> int:
    """pid 1 of the new namespaces: apply the remaining layers, report, execve the target.
    Returns an exit code only when the target did not start."""
    if _read_exact(lifeline, 1) != b"g":
        return 137  # launcher gone before the caller acknowledged our pid
    policy = Policy.from_json(cfg["policy"])
    argv, env = cfg["argv"], cfg["env"]
    if ns.active and os.getpid() != 1:
        ns = Layer("namespaces", False, f"the child is pid {os.getpid()}, not 1: no new PID "
                                        f"namespace")
    layers = [ns]
    mounts, private_shm = _private_mounts(ns)
    mounts, hidden = _hide(policy, mounts)
    mounts, revealed = _reveal(policy, mounts)
    for note in (hidden, revealed):
        if note:
            mounts = Layer(mounts.name, mounts.active, f"{mounts.detail}; {note}")
    layers.append(mounts)
    layers.append(_join_cgroups(cfg["cgroups"], policy))
    try:
        target = _resolve(argv[0], env)
    except OSError as e:
        _send(status_fd, {"exec_error": e.errno, "message": str(e)})
        return 127
    ruleset, ll_detail = (_landlock_prepare(policy, _exec_chain(target), private_shm,
                                            mounts.active)
                          if IS_LINUX else (None, "unavailable: not Linux"))
    layers.append(_rlimits(policy))
    layers.append(_drop_uid(policy))
    lifetime = _arm_parent_death(lifeline)
    layers.append(_no_new_privs())
    layers.append(_landlock_enforce(ruleset, ll_detail))
    layers.append(_seccomp_stage1(policy))
    layers.append(lifetime)
    report = [layer.to_json() for layer in layers]
    missing = [layer for layer in layers if not layer.active and _needed(layer.name, policy)]
    if policy.mode == "require" and missing:
        _send(status_fd, {"error": "; ".join(f"layer {m.name!r} unavailable: {m.detail}"
                                             for m in missing), "report": report})
        return 125
    _send(status_fd, {"report": report})
    try:
        os.execve(target, argv, env)
    except OSError as e:
        _send(status_fd, {"exec_error": e.errno, "message": f"execve {target}: {e.strerror}"
                                                           f"{_exec_hint(target)}"})
    return 127


def _exec_hint(target: str) -> str:
    """Why the sandbox uid may not execute `target`, when a closed directory explains it."""
    blocker = closed_ancestor(target, os.getuid(), os.getgid())
    if blocker is None:
        return ""
    return f" (uid {os.getuid()} cannot search {blocker}; add the interpreter's prefix to " \
           f"Policy.reveal, e.g. sandbox.interpreter_paths())"


def _mirror_exit(pid: int) -> int:
    """Wait for the child and end the launcher the same way (exit code or signal)."""
    while True:
        _, st = os.waitpid(pid, 0)
        if os.WIFEXITED(st):
            return os.WEXITSTATUS(st)
        if os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            try:
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
            except (OSError, ValueError):
                pass  # the exit code below still says which signal
            return 128 + sig


def _launcher(config_fd: int, status_fd: int) -> int:
    """The launcher process: read the config, arm its own parent-death signal, unshare, fork
    the namespace init, tell the caller its pid, wait for the caller's acknowledgement (so the
    pid cannot be reaped and reused before the caller holds a pidfd), and mirror its exit."""
    import resource
    n, = struct.unpack("<Q", _read_exact(config_fd, 8))
    cfg = json.loads(_read_exact(config_fd, n))
    os.set_inheritable(status_fd, False)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if IS_LINUX:
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError as e:
            _send(status_fd, {"error": f"launcher: PR_SET_PDEATHSIG failed: {e}"})
            return 125
        if os.getppid() != cfg["caller_pid"]:
            return 137  # the caller died before we armed the signal
    ns, _userns = _enter_namespaces()
    life_r, life_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 126
        try:
            os.close(life_w)
            os.close(config_fd)
            code = _child(cfg, ns, status_fd, life_r)
        except BaseException as e:  # noqa: BLE001 - a setup bug must reach the caller
            try:
                _send(status_fd, {"error": f"sandbox setup failed: {type(e).__name__}: {e}"})
            finally:
                os._exit(126)
        os._exit(code)
    os.close(life_r)
    _send(status_fd, {"pid": pid, "pidns": ns.active})
    if _read_exact(config_fd, 1) != b"a":
        os.kill(pid, signal.SIGKILL)
    os.close(config_fd)
    os.write(life_w, b"g")
    os.close(status_fd)
    return _mirror_exit(pid)


# =================================================================================================
# The caller's side
# =================================================================================================

class Sandboxed:
    """A confined process. `pid` is the namespace init as the caller's PID namespace numbers it
    (SIGSTOP/SIGCONT/SIGKILL work on it; /proc/<pid>/task lists its threads); `report` lists the
    layers as applied. `wait`/`poll` return the target's status like Popen.returncode. The
    cgroups are removed once the launcher has exited."""

    def __init__(self, proc: "subprocess.Popen", pid: int, report: list[Layer],
                 cgroups: list[str], pidfd: int | None, pidns: bool) -> None:
        self.pid = pid
        self.report = report
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self.cgroup_dirs = list(cgroups)
        self._proc = proc
        self._pidfd = pidfd
        self._pidns = pidns
        self._cleaned = False

    @property
    def launcher_pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def layer(self, name: str) -> Layer | None:
        return next((la for la in self.report if la.name == name), None)

    def poll(self) -> int | None:
        rc = self._proc.poll()
        if rc is not None:
            self._cleanup()
        return rc

    def wait(self, timeout: float | None = None) -> int:
        """Raises subprocess.TimeoutExpired like Popen.wait."""
        rc = self._proc.wait(timeout)
        self._cleanup()
        return rc

    def communicate(self, input: bytes | None = None, timeout: float | None = None
                    ) -> tuple[bytes | None, bytes | None]:
        out = self._proc.communicate(input, timeout)
        self._cleanup()
        return out

    def send_kill(self) -> None:
        """SIGKILL the namespace init (the kernel then kills everything in the namespace and the
        launcher reaps it only after all of them are gone), anything left in the cgroups, and
        the whole session when there is no PID namespace; without waiting (`kill` waits)."""
        if self._proc.poll() is None:
            self._signal_init(signal.SIGKILL)
            for d in self.cgroup_dirs:
                for p in _cgroup_pids(d):
                    _kill_quietly(p, signal.SIGKILL)
            if not self._pidns:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except OSError:
                    pass  # the group is already empty

    def kill(self) -> None:
        """`send_kill`, then wait for the launcher and remove the cgroups."""
        if self._proc.poll() is None:
            self.send_kill()
            import subprocess
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._cleanup()

    def send_signal(self, sig: int) -> None:
        """Signal the namespace init (inside the namespace only signals it handles arrive; from
        here SIGKILL and SIGSTOP always do)."""
        if self._proc.poll() is None:
            self._signal_init(sig)

    def _signal_init(self, sig: int) -> None:
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass  # already reaped
            return
        _kill_quietly(self.pid, sig)

    def _cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self.cgroups_left = _remove_cgroups(self.cgroup_dirs)

    def __enter__(self) -> Sandboxed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()


def _kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass  # gone (or never ours): nothing to stop


_LAUNCHER_PYC: str | None = None


def _launcher_program() -> str:
    """This file compiled into ``$TMPDIR/ksearch-sandbox-launcher-<uid>/sandbox-<hash>.pyc``
    (hash of the source and the interpreter version), so that a launcher does not compile 2000
    lines on every launch (20-35 ms). The directory must be ours and closed to others, else the
    source is used; nothing accumulates when callers die."""
    global _LAUNCHER_PYC
    src = os.path.abspath(__file__)
    if not src.endswith(".py"):
        return src
    if _LAUNCHER_PYC is not None and os.path.exists(_LAUNCHER_PYC):
        return _LAUNCHER_PYC
    import hashlib
    import importlib.util
    import marshal
    import stat
    import tempfile
    with open(src, "rb") as f:
        data = f.read()
    key = hashlib.sha256(data + sys.version.encode()).hexdigest()[:20]
    d = os.path.join(tempfile.gettempdir(), f"ksearch-sandbox-launcher-{os.getuid()}")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return src
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return src  # someone else's directory: do not run code from it
    path = os.path.join(d, f"sandbox-{key}.pyc")
    if not os.path.exists(path):
        code = compile(data, src, "exec", dont_inherit=True)
        head = importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, 0, len(data) & 0xFFFFFFFF)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(head + marshal.dumps(code))
        os.replace(tmp, path)
    _LAUNCHER_PYC = path
    return path


def _target_env(env: dict[str, str], policy: Policy) -> dict[str, str]:
    out = dict(env)
    out.setdefault("OMP_WAIT_POLICY", "passive")
    out.setdefault("TMPDIR", policy.workdir)
    return out


def _validate(argv: list[str], policy: Policy) -> None:
    if not argv:
        raise ValueError("empty argv")
    if policy.mode not in ("best-effort", "require"):
        raise ValueError(f"mode must be 'best-effort' or 'require', not {policy.mode!r}")
    for p in (policy.workdir, *policy.readable):
        if not os.path.isabs(p):
            raise ValueError(f"policy paths must be absolute: {p!r}")
    if not os.path.isdir(policy.workdir):
        raise ValueError(f"workdir {policy.workdir!r} is not a directory")
    work = os.path.realpath(policy.workdir)
    for h in policy.hide:
        if not os.path.isabs(h):
            raise ValueError(f"policy paths must be absolute: {h!r}")
        real = os.path.realpath(h)
        if work == real or work.startswith(real.rstrip("/") + "/"):
            raise ValueError(f"workdir {policy.workdir!r} is beneath hidden {h!r}")


def launch(argv: list[str], policy: Policy, *, env: dict[str, str], pass_fds: tuple[int, ...] = (),
           stdin: object = None, stdout: object = None, stderr: object = None,
           cwd: str | None = None) -> Sandboxed:
    """Start `argv` confined by `policy` and return once the target has been executed (or raise
    SandboxUnavailable / OSError before it runs). `env` is the target's whole environment
    (OMP_WAIT_POLICY=passive and TMPDIR=workdir are added unless given); `pass_fds` stay open in
    the target at the same numbers; stdin/stdout/stderr as for subprocess.Popen; `cwd` defaults
    to the workdir.

    The sandbox dies with the thread that calls this (PR_SET_PDEATHSIG follows the spawning
    thread): call it from a thread that outlives the sandbox."""
    import subprocess  # here, not at the top: the launcher never needs it
    _validate(argv, policy)
    plan = _make_cgroups(policy)
    cfg = {"argv": list(argv), "env": _target_env(env, policy), "policy": policy.to_json(),
           "cgroups": plan.to_json(), "caller_pid": os.getpid()}
    cfg_r, cfg_w = os.pipe()
    st_r, st_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", _launcher_program(),
             "--config-fd", str(cfg_r), "--status-fd", str(st_w)],
            pass_fds=(cfg_r, st_w, *pass_fds), stdin=stdin, stdout=stdout, stderr=stderr,
            cwd=cwd or policy.workdir, env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"},
            start_new_session=True)
    except BaseException:
        for fd in (cfg_r, cfg_w, st_r, st_w):
            os.close(fd)
        _remove_cgroups(plan.dirs)
        raise
    os.close(cfg_r)
    os.close(st_w)
    cfg_file = os.fdopen(cfg_w, "wb", buffering=0)
    try:
        return _handshake(proc, cfg, plan, cfg_file, st_r)
    except BaseException:
        _abort(proc, plan)
        raise
    finally:
        os.close(st_r)
        cfg_file.close()


def _abort(proc: subprocess.Popen, plan: _CgroupPlan) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass  # already gone
    proc.wait()
    _remove_cgroups(plan.dirs)


def _handshake(proc: subprocess.Popen, cfg: dict, plan: _CgroupPlan, cfg_w, st_r: int
               ) -> Sandboxed:
    """Send the config, collect the launcher's messages until the status pipe closes (the
    target's execve closes the child's end), acknowledge the pid once a pidfd holds it."""
    data = json.dumps(cfg).encode()
    try:
        data = struct.pack("<Q", len(data)) + data
        while data:
            data = data[cfg_w.write(data):]
    except BrokenPipeError:
        pass  # the launcher died; its status (or its absence) says why
    msgs: dict = {}
    pidfd = None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([st_r], [], [], left)[0]:
            raise SandboxUnavailable(f"launcher sent no report within {STARTUP_TIMEOUT_S} s")
        chunk = os.read(st_r, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            msgs.update(msg)
            if "pid" in msg:
                pidfd = _pidfd_open(msg["pid"])
                try:
                    cfg_w.write(b"a")
                except BrokenPipeError:
                    pass  # the launcher died; reported below
                cfg_w.close()
    if "error" in msgs or "exec_error" in msgs or "report" not in msgs or "pid" not in msgs:
        if pidfd is not None:
            os.close(pidfd)
        rc = proc.wait()
        _remove_cgroups(plan.dirs)
        if "exec_error" in msgs:
            raise OSError(msgs["exec_error"], msgs.get("message", "execve failed"))
        raise SandboxUnavailable(msgs.get("error") or f"launcher exited with {rc} before the "
                                                      f"target started")
    report = [Layer.from_json(x) for x in msgs["report"]]
    return Sandboxed(proc, msgs["pid"], report, plan.dirs, pidfd, bool(msgs.get("pidns")))


def _pidfd_open(pid: int) -> int | None:
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None  # no pidfd support: fall back to kill(pid)


# =================================================================================================
# probe: what the sandbox actually stops, measured from inside
# =================================================================================================

_PROBE_SCRIPT = r"""
import ctypes, json, mmap, os, socket, sys, threading
a = json.loads(sys.argv[1])
launcher = json.loads(sys.stdin.readline())["launcher_pid"]
def emit(name, blocked, detail):
    print(json.dumps({"name": name, "blocked": blocked, "detail": detail}), flush=True)
def attempt(name, fn):
    try:
        emit(name, False, "succeeded: " + str(fn()))
    except OSError as e:
        emit(name, True, f"{type(e).__name__}: {e}")
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
def sock(fam):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.close()
    return fam
def read(path):
    with open(path, "rb") as f:
        return f"{len(f.read())} bytes"
def write(path, mode):
    with open(path, mode) as f:
        f.write("x")
    return path
libc = ctypes.CDLL(None, use_errno=True)
def ptrace(pid):
    if libc.ptrace(ctypes.c_long(16), ctypes.c_long(pid), None, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    libc.ptrace(ctypes.c_long(17), ctypes.c_long(pid), None, None)
    return pid
def big_map():
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    m = mmap.mmap(-1, 64 << 30, flags=flags)
    m.close()
    return "64 GiB mapped"
status = [l.split() for l in open("/proc/self/status")]
emit("identity", None, f"uid {os.getuid()} pid {os.getpid()} " + " ".join(
    " ".join(l[:2]) for l in status if l[0] in ("NoNewPrivs:", "Seccomp:")))
attempt("fork", fork)
attempt("socket_inet", lambda: sock(socket.AF_INET))
attempt("socket_unix", lambda: sock(socket.AF_UNIX))
attempt("environ_caller", lambda: read(f"/proc/{a['caller']}/environ"))
attempt("environ_launcher", lambda: read(f"/proc/{launcher}/environ"))
pids = [p for p in os.listdir("/proc") if p.isdigit()]
emit("see_caller_pid", str(a["caller"]) not in pids and str(launcher) not in pids,
     f"/proc lists pids {sorted(pids, key=int)[:10]}")
attempt("write_outside_workdir", lambda: write(os.path.join(a["outside"], "escape"), "w"))
attempt("write_protected_file", lambda: write(a["protected"], "a"))
if a["as_limit"]:
    attempt("mmap_64gib", big_map)
else:
    emit("mmap_64gib", None, "skipped: the policy sets no address-space limit")
attempt("ptrace_caller", lambda: ptrace(a["caller"]))
attempt("signal_caller", lambda: os.kill(a["caller"], 0))
attempt("signal_launcher", lambda: os.kill(launcher, 0))
attempt("setuid_0", lambda: os.setuid(0))
attempt("exec", lambda: os.execv("/bin/true", ["true"]))
sys.path.insert(0, a["harness"])
from ksearch_harness.sandbox import lock_down
layer = lock_down()
emit("lock_down", None, ("active: " if layer.active else "INACTIVE: ") + layer.detail)
attempt("fork_after_lock_down", fork)
attempt("exec_after_lock_down", lambda: os.execv("/bin/true", ["true"]))
t = threading.Thread(target=lambda: None); t.start(); t.join()
emit("threads_after_lock_down", False, "a thread ran")
"""

_PROBE_ESCAPES = ("fork", "socket_inet", "socket_unix", "environ_caller", "environ_launcher",
                  "see_caller_pid", "write_outside_workdir", "write_protected_file",
                  "mmap_64gib", "ptrace_caller", "signal_caller", "signal_launcher", "setuid_0",
                  "exec", "fork_after_lock_down", "exec_after_lock_down")


def probe(policy: Policy | None = None, python: str | None = None) -> dict:
    """Launch a confined interpreter that attempts each forbidden thing (fork, exec, sockets,
    the caller's and launcher's /proc entries, writes outside the workdir and into a read-only
    file, a 64 GiB mapping under an address-space limit, ptrace/signal of the caller, setuid(0),
    then fork/exec after lock_down()) and report what actually happened. `escapes` lists every
    attempt that succeeded; `ok` is true when there is none and the probe ran to its end."""
    import shutil
    import tempfile
    root = tempfile.mkdtemp(prefix="ksearch-sandbox-probe-")
    try:
        os.chmod(root, 0o755)
        outside = os.path.join(root, "outside")
        os.mkdir(outside)
        os.chmod(outside, 0o777)  # only the sandbox may stop a write here, not file modes
        protected = os.path.join(root, "protected.txt")
        with open(protected, "w") as f:
            f.write("must not change\n")
        os.chmod(protected, 0o666)
        if policy is None:
            work = os.path.join(root, "work")
            os.mkdir(work)
            policy = Policy(workdir=work, address_space_bytes=4 << 30, memory_bytes=1 << 30,
                            cpu_seconds=60, file_bytes=64 << 20, tasks=64,
                            reveal=interpreter_paths() if python is None else ())
        return _run_probe(policy, python or sys.executable, outside, protected)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_probe(policy: Policy, python: str, outside: str, protected: str) -> dict:
    args = {"caller": os.getpid(), "outside": outside, "protected": protected,
            "as_limit": policy.address_space_bytes is not None,
            "harness": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    import subprocess
    result: dict = {"platform": sys.platform, "machine": os.uname().machine, "layers": [],
                    "attempts": {}, "escapes": [], "ok": False}
    try:
        box = launch([python, "-I", "-S", "-B", "-c", _PROBE_SCRIPT, json.dumps(args)], policy,
                     env={"PATH": os.defpath}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    except (SandboxUnavailable, OSError) as e:
        result["error"] = str(e)
        return result
    result["layers"] = [la.to_json() for la in box.report]
    try:
        out, err = box.communicate(json.dumps({"launcher_pid": box.launcher_pid}).encode() + b"\n",
                                   timeout=60)
    except subprocess.TimeoutExpired:
        box.kill()
        out, err = b"", b"probe timed out"
    for line in out.decode(errors="replace").splitlines():
        try:
            a = json.loads(line)
        except ValueError:
            continue
        result["attempts"][a["name"]] = {"blocked": a["blocked"], "detail": a["detail"]}
    result["returncode"] = box.returncode
    result["stderr_tail"] = err.decode(errors="replace")[-2000:]
    for name in _PROBE_ESCAPES:
        got = result["attempts"].get(name)
        if got is None:
            result["escapes"].append(f"{name} (no answer: the probe stopped before it)")
        elif got["blocked"] is False:
            result["escapes"].append(name)
    result["ok"] = not result["escapes"] and box.returncode == 0
    return result


def _main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "--config-fd" and argv[2] == "--status-fd":
        return _launcher(int(argv[1]), int(argv[3]))
    if argv == ["probe"]:
        print(json.dumps(probe(), indent=2))
        return 0
    print("usage: sandbox.py --config-fd N --status-fd M | probe", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
