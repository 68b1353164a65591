"""The sandbox (ksearch_harness/sandbox.py): confined children try each escape and must fail with
the errno of the layer that is meant to stop them (so a broken layer fails a test even where
another layer would still catch the attempt); honest work must keep working; kill() must leave
nothing behind; as root on Linux every layer must be reported active."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from ksearch_harness import sandbox
from ksearch_harness.sandbox import LAYER_NAMES, Layer, Policy, interpreter_paths, launch

LINUX = sandbox.IS_LINUX
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
HARNESS = str(Path(sandbox.__file__).resolve().parents[1])
PY = sys.executable
ARCH = sandbox._ARCHES.get(os.uname().machine)
linux_only = pytest.mark.skipif(not LINUX or ARCH is None,
                                reason="namespaces, Landlock and seccomp are Linux-only")
root_only = pytest.mark.skipif(not ROOT, reason="the uid drop and cgroups need a root caller")

# Run inside the sandbox before each script: attempt() records success or the errno.
PRELUDE = r"""
import ctypes, json, os, sys
R = {}
A = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        R[name] = {"ok": True, "value": repr(fn())}
    except OSError as e:
        R[name] = {"ok": False, "errno": e.errno, "error": str(e)}
def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, ctypes.Array) else ctypes.c_long(a)
                                          for a in args])
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def write(path, mode="w"):
    with open(path, mode) as f:
        f.write("x")
def read(path):
    with open(path, "rb") as f:
        return len(f.read())
def done():
    print(json.dumps(R), flush=True)
"""


@pytest.fixture
def dirs():
    """A workdir, a world-writable directory outside it and a world-writable "protected" file:
    only the sandbox (not file modes) can stop writes to the last two."""
    root = tempfile.mkdtemp(prefix="ksearch-sandbox-test-")
    os.chmod(root, 0o755)
    d = {"root": root, "work": os.path.join(root, "work"), "outside": os.path.join(root, "out"),
         "protected": os.path.join(root, "protected.txt")}
    os.mkdir(d["work"])
    os.mkdir(d["outside"])
    os.chmod(d["outside"], 0o777)
    with open(d["protected"], "w") as f:
        f.write("original\n")
    os.chmod(d["protected"], 0o666)
    yield d
    shutil.rmtree(root, ignore_errors=True)


def policy(work: str, **kw) -> Policy:
    kw.setdefault("reveal", interpreter_paths())
    return Policy(workdir=work, **kw)


def run_py(code: str, pol: Policy, args: dict | None = None, *, timeout: float = 30,
           pass_fds: tuple[int, ...] = (), env: dict | None = None) -> tuple[int, dict, str]:
    """Run PRELUDE + code confined; returns (returncode, the JSON it printed, stderr)."""
    box = launch([PY, "-S", "-B", "-c", PRELUDE + textwrap.dedent(code), json.dumps(args or {})],
                 pol, env=env if env is not None else {"PYTHONPATH": HARNESS},
                 pass_fds=pass_fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = box.communicate(timeout=timeout)
    lines = out.decode().strip().splitlines()
    return box.returncode, (json.loads(lines[-1]) if lines else {}), err.decode()


def ns_members(pidns: str) -> list[int]:
    """Processes (from the caller's /proc) whose PID namespace is `pidns`, zombies excluded."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{p}/ns/pid") != pidns:
                continue
            with open(f"/proc/{p}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(int(p))
    return out


# --- escapes -------------------------------------------------------------------------------------

ESCAPES = r"""
import mmap, socket, subprocess, resource
nr = A["nr"]
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
attempt("fork", fork)
attempt("subprocess", lambda: subprocess.run(["/bin/true"]).returncode)
attempt("socket_inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
attempt("socket_unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
attempt("socketpair", lambda: socket.socketpair())
attempt("ptrace_parent", lambda: sc(nr["ptrace"], 16, A["parent"], 0, 0))
attempt("kill_parent", lambda: os.kill(A["parent"], 0))
attempt("environ_parent", lambda: read(f"/proc/{A['parent']}/environ"))
R["proc_pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
R["net_devices"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
attempt("setuid_0", lambda: os.setuid(0))
attempt("write_outside", lambda: write(os.path.join(A["outside"], "escape")))
attempt("write_tmp", lambda: write(A["tmp_file"]))
attempt("write_protected", lambda: write(A["protected"], "a"))
attempt("read_protected", lambda: read(A["protected"]))
attempt("mmap_64gib", lambda: mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                        | getattr(mmap, "MAP_NORESERVE", 0x4000)).close())
attempt("unshare_user", lambda: sc(nr["unshare"], 0x10000000))
attempt("personality", lambda: sc(nr["personality"], 0xFFFFFFFF))
attempt("userfaultfd", lambda: sc(nr["userfaultfd"], 1))
attempt("keyctl_session", lambda: sc(nr["keyctl"], 0, -3, 0))
attempt("io_uring_setup", lambda: sc(nr["io_uring_setup"], 1, ctypes.create_string_buffer(120)))
pe = ctypes.create_string_buffer(128)
ctypes.memmove(pe, (ctypes.c_uint32 * 2)(1, 128), 8)           # PERF_TYPE_SOFTWARE, size
ctypes.memmove(ctypes.byref(pe, 8), (ctypes.c_uint64 * 1)(1), 8)  # PERF_COUNT_SW_TASK_CLOCK
ctypes.memmove(ctypes.byref(pe, 40), (ctypes.c_uint64 * 1)((1 << 5) | (1 << 6)), 8)
attempt("perf_event_open", lambda: sc(nr["perf_event_open"], pe, 0, -1, -1, 0))
status = {l.split(":")[0]: l.split(":", 1)[1].strip() for l in open("/proc/self/status")}
R["status"] = {k: status.get(k) for k in ("Uid", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp")}
R["rlimits"] = {k: resource.getrlimit(getattr(resource, k))[0]
                for k in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_NOFILE",
                          "RLIMIT_CPU", "RLIMIT_FSIZE")}
R["cgroup"] = open("/proc/self/cgroup").read()
R["pid"] = os.getpid()
R["env"] = dict(os.environ)
done()  # a successful exec below replaces this process: its answer is then missing
attempt("exec", lambda: os.execv("/bin/true", ["true"]))
attempt("fexecve", lambda: os.execve(os.open("/bin/true", os.O_RDONLY), ["true"], {}))
open(os.path.join(A["work"], "run.sh"), "w").write("#!/bin/sh\nexit 0\n")
os.chmod(os.path.join(A["work"], "run.sh"), 0o755)
attempt("exec_from_workdir", lambda: os.execv(os.path.join(A["work"], "run.sh"), ["run.sh"]))
done()
"""

# attempt -> errno that only the named layer produces (the others would let it through or fail
# differently), so each assertion pins one layer.
EXPECTED_ERRNO = {
    "fork": (1, "seccomp: fork-like clone"),
    "subprocess": (1, "seccomp: vfork/clone"),
    "exec": (13, "landlock: execute only the target"),
    "fexecve": (1, "seccomp: execveat"),
    "exec_from_workdir": (13, "landlock: no execute beneath workdir"),
    "socket_inet": (1, "seccomp: socket"),
    "socket_unix": (1, "seccomp: socket"),
    "socketpair": (1, "seccomp: socketpair"),
    "ptrace_parent": (1, "seccomp: ptrace (the pid namespace alone gives ESRCH)"),
    "kill_parent": (3, "pid namespace: the parent does not exist here"),
    "environ_parent": (2, "fresh /proc: no entry for the parent"),
    "setuid_0": (1, "uid drop"),
    "write_outside": (13, "landlock: the directory is mode 0777"),
    "write_tmp": (13, "landlock: /tmp is mode 1777"),
    "write_protected": (13, "landlock: the file is mode 0666"),
    "mmap_64gib": (12, "RLIMIT_AS (MAP_NORESERVE: overcommit would allow it)"),
    "unshare_user": (1, "seccomp: unshare (unprivileged user namespaces are allowed)"),
    "personality": (1, "seccomp: personality"),
    "userfaultfd": (1, "seccomp: userfaultfd (user-mode-only is allowed unprivileged)"),
    "keyctl_session": (1, "seccomp: keyctl (the session keyring is the caller's)"),
    "io_uring_setup": (1, "seccomp: io_uring"),
    "perf_event_open": (1, "seccomp: perf_event_open (paranoid 2 allows self-counting)"),
}


@pytest.fixture(scope="module")
def escapes():
    """One confined child runs every attempt (as the accused would be confined)."""
    root = tempfile.mkdtemp(prefix="ksearch-sandbox-esc-")
    os.chmod(root, 0o755)
    work, outside, protected = (os.path.join(root, n) for n in ("work", "out", "protected"))
    os.mkdir(work)
    os.mkdir(outside)
    os.chmod(outside, 0o777)
    Path(protected).write_text("original\n")
    os.chmod(protected, 0o666)
    pol = policy(work, address_space_bytes=2 << 30, memory_bytes=512 << 20, cpu_seconds=30,
                 file_bytes=16 << 20, tasks=48)
    tmp_file = f"/tmp/ksearch-sandbox-escape-{os.getpid()}-{os.urandom(4).hex()}"
    args = {"nr": ARCH.nr, "parent": os.getpid(), "work": work, "outside": outside,
            "protected": protected, "tmp_file": tmp_file}
    try:
        box = launch([PY, "-S", "-B", "-c", PRELUDE + ESCAPES, json.dumps(args)], pol,
                     env={"KSEARCH_VISIBLE": "1"}, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
        out, err = box.communicate(timeout=30)
        lines = out.decode().strip().splitlines()
        yield {"report": box.report, "rc": box.returncode, "err": err.decode(),
               "r": json.loads(lines[-1]) if lines else {}, "policy": pol,
               "protected": Path(protected).read_text(), "outside": os.listdir(outside),
               "tmp_file_made": os.path.exists(tmp_file)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if os.path.exists(tmp_file):
            os.unlink(tmp_file)


@linux_only
@pytest.mark.parametrize("name", sorted(EXPECTED_ERRNO))
def test_escape_fails_with_the_layers_errno(escapes, name):
    got = escapes["r"].get(name)
    assert got is not None, f"no answer for {name} (an exec replaced the process?) " \
                            f"{escapes['err']}"
    want, why = EXPECTED_ERRNO[name]
    if name == "setuid_0" and not ROOT:
        want = 22  # uid 0 is not mapped in the caller's user namespace
    assert not got["ok"], f"{name} succeeded ({why})"
    assert got["errno"] == want, f"{name}: {got['error']}; expected errno {want} from {why}"


@linux_only
def test_escapes_left_no_trace(escapes):
    assert escapes["rc"] == 0, escapes["err"]
    assert escapes["protected"] == "original\n"
    assert escapes["outside"] == []
    assert not escapes["tmp_file_made"]
    assert escapes["r"]["read_protected"]["ok"]  # read-only, not hidden


@linux_only
def test_confined_process_sees_only_itself(escapes):
    r = escapes["r"]
    assert r["pid"] == 1 and r["proc_pids"] == [1]
    assert r["net_devices"] == ["lo"]
    assert r["env"]["KSEARCH_VISIBLE"] == "1" and r["env"]["OMP_WAIT_POLICY"] == "passive"
    assert r["env"]["TMPDIR"] == escapes["policy"].workdir
    assert not any("SECRET" in k for k in r["env"])


@linux_only
def test_kernel_state_matches_the_report(escapes):
    r, pol = escapes["r"], escapes["policy"]
    assert r["status"]["NoNewPrivs"] == "1" and r["status"]["Seccomp"] == "2"
    assert r["status"]["CapEff"].strip("0") == "" and r["status"]["CapPrm"].strip("0") == ""
    assert r["rlimits"] == {"RLIMIT_AS": pol.address_space_bytes, "RLIMIT_NPROC": pol.tasks,
                            "RLIMIT_CORE": 0, "RLIMIT_NOFILE": pol.open_files,
                            "RLIMIT_CPU": pol.cpu_seconds, "RLIMIT_FSIZE": pol.file_bytes}
    if ROOT:
        assert r["status"]["Uid"].split() == [str(sandbox.NOBODY)] * 4
        assert "ksearch-sandbox-" in r["cgroup"]


@linux_only
@root_only
def test_every_layer_active_as_root(escapes):
    """CI runs as root on Linux: a silently broken layer must fail here."""
    report = {la.name: la for la in escapes["report"]}
    assert sorted(report) == sorted(LAYER_NAMES)
    inactive = [f"{la.name}: {la.detail}" for la in report.values() if not la.active]
    assert not inactive
    assert "scoped" in report["landlock"].detail and "ABI" in report["landlock"].detail


@linux_only
@root_only
def test_cgroup_limits_are_in_force(dirs):
    code = r"""
    paths = dict(l.split(":", 2)[1:] for l in open("/proc/self/cgroup").read().splitlines())
    def val(ctrl, fname):
        for mnt in (f"/sys/fs/cgroup/{ctrl}", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            for key in (ctrl, ""):
                p = f"{mnt}{paths.get(key, '')}/{fname}"
                if key in paths and os.path.exists(p):
                    return open(p).read().strip()
    R["mem"] = val("memory", "memory.limit_in_bytes") or val("memory", "memory.max")
    R["pids"] = val("pids", "pids.max")
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"], memory_bytes=96 << 20, tasks=40))
    assert rc == 0, err
    assert r == {"mem": str(96 << 20), "pids": "40"}


@linux_only
@root_only
def test_memory_cgroup_kills_an_overallocation(dirs):
    code = r"""
    blocks = [bytearray(16 << 20) for _ in range(16)]   # 256 MiB, touched
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"], memory_bytes=64 << 20))
    assert rc == -signal.SIGKILL, (rc, err)
    assert r == {}


@linux_only
def test_address_space_attempt_needs_the_limit(dirs):
    """Control for mmap_64gib: without RLIMIT_AS the same mapping succeeds, so the escape test
    measures the limit and not overcommit."""
    code = r"""
    import mmap
    attempt("mmap", lambda: mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                      | getattr(mmap, "MAP_NORESERVE", 0x4000)).close())
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"]))
    assert rc == 0 and r["mmap"]["ok"], (r, err)


@linux_only
def test_thread_bomb_is_bounded(dirs):
    code = r"""
    import threading
    stop = threading.Event()
    n = 0
    try:
        for _ in range(1000):
            threading.Thread(target=stop.wait, daemon=True).start()
            n += 1
    except RuntimeError as e:
        R["error"] = str(e)
    R["threads"] = n
    stop.set()
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"], tasks=24))
    assert rc == 0, err
    assert 4 <= r["threads"] < 24 and "start new thread" in r["error"], r


@linux_only
def test_x32_system_calls_kill_the_process(dirs):
    if os.uname().machine != "x86_64":
        pytest.skip("x32 exists on x86_64 only")
    code = r"""
    libc.syscall(ctypes.c_long(0x40000000 | 39))   # getpid through the x32 ABI
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"]))
    assert rc == -signal.SIGSYS and r == {}, (rc, err)


@linux_only
def test_namespace_clones_denied_even_when_fork_is_allowed(dirs):
    code = r"""
    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        return os.waitpid(pid, 0)[1]
    attempt("fork", fork)
    def clone_user():
        r = sc(A["clone"], 0x10000000 | 17, 0, 0, 0, 0)   # CLONE_NEWUSER | SIGCHLD
        if r == 0:
            os._exit(0)
        return os.waitpid(r, 0)[1]
    attempt("clone_newuser", clone_user)
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"], allow_fork=True), {"clone": ARCH.nr["clone"]})
    assert rc == 0, err
    assert r["fork"]["ok"], r
    assert not r["clone_newuser"]["ok"] and r["clone_newuser"]["errno"] == 1, r


@linux_only
def test_gpu_policy_knobs(dirs):
    """What the CUDA driver needs (AF_UNIX sockets, writes beneath the private /proc) is opt-in,
    and `hide` covers a directory with an empty read-only tmpfs."""
    Path(dirs["outside"], "visible-outside").write_text("x")
    code = r"""
    import socket, threading
    comm = f"/proc/self/task/{threading.get_native_id()}/comm"
    attempt("socket_unix", lambda: socket.socket(socket.AF_UNIX).close())
    attempt("socket_inet", lambda: socket.socket(socket.AF_INET).close())
    attempt("write_comm", lambda: write(comm))
    attempt("write_hidden", lambda: write(A["outside"] + "/new"))
    R["hidden_listing"] = os.listdir(A["outside"])
    done()
    """
    args = {"outside": dirs["outside"]}
    rc, r, err = run_py(code, policy(dirs["work"], socket_families=(socket.AF_UNIX,),
                                     proc_writable=True, hide=(dirs["outside"],)), args)
    assert rc == 0, err
    assert r["socket_unix"]["ok"] and r["socket_inet"]["errno"] == 1, r
    assert r["write_comm"]["ok"], r
    assert r["hidden_listing"] == [] and r["write_hidden"]["errno"] == 30, r  # EROFS
    rc, r, err = run_py(code, policy(dirs["work"]), args)
    assert rc == 0, err
    assert r["socket_unix"]["errno"] == 1 and r["write_comm"]["errno"] == 13, r
    assert r["hidden_listing"] == ["visible-outside"] and r["write_hidden"]["errno"] == 13, r
    with pytest.raises(ValueError):
        launch([PY], policy(dirs["work"], hide=(dirs["root"],)), env={})


# --- lock_down -----------------------------------------------------------------------------------

@linux_only
def test_lock_down_covers_threads_started_before_it(dirs):
    """Exec, fork and unix sockets work before lock_down(); afterwards they fail in a thread
    that already existed (TSYNC), while new threads still start and a socket opened before
    still carries data."""
    code = r"""
    import socket, threading, subprocess
    from ksearch_harness.sandbox import lock_down
    go, finished = threading.Event(), threading.Event()
    def old_thread():
        go.wait()
        attempt("fork_in_old_thread", lambda: subprocess.run(["/bin/true"]).returncode)
        attempt("exec_in_old_thread", lambda: os.execv("/bin/true", ["true"]))
        attempt("unix_socket_in_old_thread", lambda: socket.socket(socket.AF_UNIX).close())
        attempt("socketpair_in_old_thread", lambda: socket.socketpair())
        finished.set()
    threading.Thread(target=old_thread).start()
    attempt("exec_before", lambda: subprocess.run(["/bin/true"]).returncode)
    attempt("unix_socket_before", lambda: socket.socket(socket.AF_UNIX).close())
    a, b = socket.socketpair()
    layer = lock_down()
    attempt("old_pair_carries", lambda: (a.send(b"x"), b.recv(1))[1].decode())
    attempt("connect_after", lambda: a.connect("\0ksearch-lock-down-test"))
    R["layer"] = [layer.active, layer.detail]
    go.set()
    finished.wait(10)
    t = threading.Thread(target=lambda: R.setdefault("new_thread", "ran"))
    t.start(); t.join()
    done()
    """
    rc, r, err = run_py(code, policy(dirs["work"], allow_exec=True, allow_fork=True,
                                     socket_families=(socket.AF_UNIX,)))
    assert rc == 0, err
    assert r["exec_before"] == {"ok": True, "value": "0"}, r
    assert r["unix_socket_before"]["ok"], r
    assert r["old_pair_carries"] == {"ok": True, "value": "'x'"}, r
    assert r["layer"][0], r["layer"]
    for name in ("fork_in_old_thread", "exec_in_old_thread", "unix_socket_in_old_thread",
                 "socketpair_in_old_thread", "connect_after"):
        assert not r[name]["ok"] and r[name]["errno"] == 1, (name, r[name])
    assert r["new_thread"] == "ran"


# --- honest work ---------------------------------------------------------------------------------

@linux_only
def test_honest_work_still_works(dirs):
    data = b"ksearch memfd payload"
    fd = os.memfd_create("sandbox-test")
    os.write(fd, data)
    code = r"""
    import mmap, tempfile, threading
    from ksearch_harness.sandbox import lock_down
    attempt("write_workdir", lambda: write(os.path.join(A["work"], "out.txt")))
    attempt("tempfile", lambda: tempfile.NamedTemporaryFile().close())
    attempt("dev_null", lambda: write("/dev/null"))
    attempt("dev_shm", lambda: write("/dev/shm/x"))
    attempt("read_source", lambda: read(A["source"]))
    attempt("memfd", lambda: mmap.mmap(A["fd"], 0, prot=mmap.PROT_READ)[:].decode())
    R["lock_down"] = lock_down().active
    results = []
    ts = [threading.Thread(target=lambda i=i: results.append(sum(range(i * 1000))))
          for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    R["threads"] = len(results)
    done()
    """
    try:
        rc, r, err = run_py(code, policy(dirs["work"]),
                            {"work": dirs["work"], "source": sandbox.__file__, "fd": fd},
                            pass_fds=(fd,))
    finally:
        os.close(fd)
    assert rc == 0, err
    for name in ("write_workdir", "tempfile", "dev_null", "dev_shm", "read_source", "memfd"):
        assert r[name]["ok"], (name, r[name])
    assert r["memfd"]["value"] == repr(data.decode())
    assert r["lock_down"] and r["threads"] == 8
    assert Path(dirs["work"], "out.txt").read_text() == "x"


OPENMP_C = r"""
#include <omp.h>
#include <stdio.h>
int main(void) {
    double s = 0; int n = 0;
    #pragma omp parallel reduction(+:s)
    {
        #pragma omp single
        n = omp_get_num_threads();
        #pragma omp for
        for (int i = 0; i < 1000000; i++) s += 1.0;
    }
    printf("%d %.0f\n", n, s);
    return 0;
}
"""


@linux_only
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_openmp_program_compiled_and_run_confined(dirs):
    """A compiler works under a policy that allows fork+exec; the OpenMP program it builds runs
    its thread pool under the accused's policy (no fork, no exec)."""
    Path(dirs["work"], "omp.c").write_text(OPENMP_C)
    cc = os.path.realpath(shutil.which("cc"))
    build = launch([cc, "-O2", "-fopenmp", "omp.c", "-o", "omp"],
                   policy(dirs["work"], allow_exec=True, allow_fork=True, tasks=64),
                   env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT)
    out, _ = build.communicate(timeout=60)
    if build.returncode != 0 and b"omp.h" in out:
        pytest.skip("the compiler has no OpenMP")
    assert build.returncode == 0, out.decode()
    run = launch([os.path.join(dirs["work"], "omp")], policy(dirs["work"], tasks=64),
                 env={"OMP_NUM_THREADS": "4"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = run.communicate(timeout=30)
    assert run.returncode == 0, err.decode()
    assert out.decode().split() == ["4", "1000000"]


# --- lifetime ------------------------------------------------------------------------------------

SLEEPERS = r"""
import time
started_r, started_w = os.pipe()
for i in range(3):
    if os.fork() == 0:
        if i == 2:              # a daemon: new session, double fork
            os.setsid()
            if os.fork():
                os._exit(0)
        os.write(started_w, b"s")
        time.sleep(120)
        os._exit(0)
got = b""
while len(got) < 3:         # every sleeper (the daemon's grandchild too) is running
    got += os.read(started_r, 3 - len(got))
print("ready", flush=True)
time.sleep(120)
"""


@linux_only
def test_kill_leaves_no_process_behind(dirs):
    box = launch([PY, "-S", "-B", "-c", PRELUDE + SLEEPERS], policy(dirs["work"], allow_fork=True),
                 env={}, stdout=subprocess.PIPE)
    assert box.stdout.readline() == b"ready\n"
    pidns = os.readlink(f"/proc/{box.pid}/ns/pid")
    assert pidns != os.readlink("/proc/self/ns/pid")
    assert len(ns_members(pidns)) >= 4
    os.kill(box.pid, signal.SIGSTOP)
    time.sleep(0.05)
    assert Path(f"/proc/{box.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    os.kill(box.pid, signal.SIGCONT)
    box.kill()
    assert box.returncode == -signal.SIGKILL
    assert ns_members(pidns) == []
    assert all(not os.path.exists(d) for d in box.cgroup_dirs)
    box.stdout.close()


@linux_only
def test_target_exit_takes_its_descendants(dirs):
    code = SLEEPERS.rsplit("time.sleep(120)", 1)[0] + "os._exit(0)\n"
    box = launch([PY, "-S", "-B", "-c", PRELUDE + code], policy(dirs["work"], allow_fork=True),
                 env={}, stdout=subprocess.PIPE)
    pidns = os.readlink(f"/proc/{box.pid}/ns/pid")
    out, _ = box.communicate(timeout=30)
    assert out == b"ready\n" and box.returncode == 0
    assert ns_members(pidns) == []


JUDGE = r"""
import json, os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from ksearch_harness.sandbox import Policy, interpreter_paths, launch
child = sys.argv[3]
box = launch([sys.executable, "-S", "-c", child, str(os.getpid())],
             Policy(workdir=sys.argv[2], reveal=interpreter_paths()), env={},
             stdout=subprocess.PIPE)
seen = json.loads(box.stdout.readline())
print(json.dumps({"pid": box.pid, "launcher": box.launcher_pid, "seen": seen}), flush=True)
time.sleep(120)
"""

PEEK = r"""
import json, os, sys, time
judge = int(sys.argv[1])
found, errors = [], {}
for p in [p for p in os.listdir("/proc") if p.isdigit()] + [str(judge)]:
    try:
        if b"hunter2-fake-secret" in open(f"/proc/{p}/environ", "rb").read():
            found.append(p)
    except OSError as e:
        errors[p] = e.errno
print(json.dumps({"found": found, "errors": errors}), flush=True)
time.sleep(120)
"""


@linux_only
def test_judge_secret_unreadable_and_sandbox_dies_with_judge(dirs):
    judge = subprocess.Popen([PY, "-S", "-B", "-c", JUDGE, HARNESS, dirs["work"], PEEK],
                             env={"KSEARCH_FAKE_SECRET": "hunter2-fake-secret"},
                             stdout=subprocess.PIPE)
    try:
        msg = json.loads(judge.stdout.readline())
    finally:
        judge.kill()
        judge.wait()
        judge.stdout.close()
    assert msg["seen"]["found"] == []
    assert msg["seen"]["errors"][str(judge.pid)] == 2  # ENOENT: not in the sandbox's /proc
    deadline = time.monotonic() + 5
    alive = [msg["pid"], msg["launcher"]]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if os.path.exists(f"/proc/{p}")
                 and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
        time.sleep(0.02)
    assert alive == [], "the sandbox outlived its caller"


# --- report and modes ----------------------------------------------------------------------------

@linux_only
@root_only
def test_require_mode_runs_when_every_layer_is_available(dirs):
    rc, r, err = run_py("done()", policy(dirs["work"], mode="require", memory_bytes=256 << 20,
                                         tasks=32))
    assert rc == 0 and r == {}, err


UNPRIVILEGED = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ksearch_harness.sandbox import Policy, SandboxUnavailable, launch
out = {"uid": os.getuid()}
box = launch([sys.executable, "-S", "-c", "import os; print(os.getpid(), os.getuid())"],
             Policy(workdir=sys.argv[2]), env={}, stdout=-1)
out["report"] = {la.name: [la.active, la.detail] for la in box.report}
out["child"] = box.communicate()[0].decode().split()
try:
    launch([sys.executable, "-c", "pass"], Policy(workdir=sys.argv[2], memory_bytes=1 << 30,
                                                  mode="require"), env={})
    out["require"] = "ran"
except SandboxUnavailable as e:
    out["require"] = str(e)
print(json.dumps(out))
"""


@linux_only
@root_only
def test_unprivileged_caller_gets_a_user_namespace_and_require_names_the_gap(dirs):
    """A non-root caller: the namespaces come with a user namespace that maps only its own uid;
    no cgroup can be made, so `require` with a memory limit refuses and names the layer."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    if py is None or sandbox.closed_ancestor(os.path.realpath(py), sandbox.NOBODY,
                                             sandbox.NOBODY):
        pytest.skip("no interpreter reachable for uid 65534")
    os.chown(dirs["work"], sandbox.NOBODY, sandbox.NOBODY)
    done_ = subprocess.run([py, "-S", "-B", "-c", UNPRIVILEGED, HARNESS, dirs["work"]],
                           user=sandbox.NOBODY, group=sandbox.NOBODY, extra_groups=[],
                           env={}, capture_output=True, timeout=60)
    assert done_.returncode == 0, done_.stderr.decode()
    out = json.loads(done_.stdout)
    rep = out["report"]
    assert out["uid"] == sandbox.NOBODY
    if not rep["namespaces"][0]:
        pytest.skip(f"unprivileged user namespaces unavailable: {rep['namespaces'][1]}")
    assert "user" in rep["namespaces"][1] and out["child"] == ["1", str(sandbox.NOBODY)]
    for name in ("mounts", "uid", "no_new_privs", "landlock", "seccomp", "lifetime"):
        assert rep[name][0], (name, rep[name])
    assert not rep["cgroup"][0]
    assert "'cgroup'" in out["require"], out["require"]


# --- probe and the pieces that work everywhere ---------------------------------------------------

@linux_only
def test_probe_finds_no_escape():
    res = sandbox.probe()
    assert res["ok"], json.dumps(res, indent=1)
    assert res["attempts"]["threads_after_lock_down"]["blocked"] is False


def test_policy_round_trips_through_json():
    pol = Policy(workdir="/w", readable=("/a", "/b"), devices=("/dev/nvidia*",), tasks=3,
                 socket_families=(socket.AF_UNIX,), reveal=("/r",), hide=("/h",),
                 proc_writable=True)
    assert Policy.from_json(json.loads(json.dumps(pol.to_json()))) == pol
    la = Layer("seccomp", True, "x")
    assert Layer.from_json(la.to_json()) == la


def test_system_call_tables_name_every_denied_call():
    for machine, arch in sandbox._ARCHES.items():
        missing = [n for n in sandbox._STAGE1_DENY if n not in arch.nr and n != "uselib"]
        assert not missing, (machine, missing)
        for name in ("clone", "clone3", "execve", "execveat", "socket", "socketpair", "seccomp"):
            assert name in arch.nr, (machine, name)
        prog = sandbox._seccomp_program(arch, sandbox._stage1_rules(Policy(workdir="/")),
                                        families=(), clone=(False, True))
        assert len(prog) < 4096 and all(jt < 256 and jf < 256 for _, jt, jf, _ in prog)


def test_bad_policies_are_refused(dirs):
    with pytest.raises(ValueError):
        launch([PY], Policy(workdir="relative"), env={})
    with pytest.raises(ValueError):
        launch([PY], Policy(workdir=dirs["work"], mode="strict"), env={})
    with pytest.raises(ValueError):
        launch([], Policy(workdir=dirs["work"]), env={})
