"""Protocol v1 (docs/ARCHITECTURE.md): request parsing and validation, result building, and the
private result channel.

Standard library only: this module runs in the supervisor before anything else is imported.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any

from . import PROTOCOL_VERSION

OPS = ("evaluate", "build", "probe", "check-task", "yardstick", "profile")
STATUSES = (
    "passed", "build_error", "static_check_failed", "incorrect", "integrity_violation",
    "runtime_error", "timeout", "task_error",
)
VIOLATION_CLASSES = (
    "output_not_written", "input_mutated", "stale_output", "deferred_work", "phase_dependent",
    "precision", "shape_specialisation", "reference_call", "forbidden_call", "timer_tampering",
    "nondeterministic", "impossible_time", "result_channel", "lazy_output", "lingering_work",
    "forbidden_kernel",
)
DTYPE_NAMES = ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u32", "bool")
DIST_KINDS = ("normal", "uniform", "rand_int", "randint", "custom")
LANGUAGES = {"c": "c", "c++": "c++", "cpp": "c++", "cxx": "c++", "cuda": "cuda", "cu": "cuda",
             "python": "python", "py": "python"}

DEFAULT_TIMING = {"warmup": 2, "min_reps": 5, "max_reps": 50, "target_seconds": 1.0,
                  "precision": 0.0, "flush_bytes": 64 << 20}
DEFAULT_TRIALS = 3
SANDBOX_MODES = ("best-effort", "require")
DEFAULT_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 4000


# --------------------------------------------------------------------------------------------
# Errors: each carries the status (and for cheats the class) it turns into.


class HarnessError(Exception):
    status = "runtime_error"

    def __init__(self, message: str, violation: str | None = None):
        super().__init__(message)
        self.message = message
        self.violation = violation


class TaskError(HarnessError):
    status = "task_error"


class BuildError(HarnessError):
    status = "build_error"


class StaticCheckFailed(HarnessError):
    status = "static_check_failed"


class Incorrect(HarnessError):
    status = "incorrect"


class Violation(HarnessError):
    status = "integrity_violation"

    def __init__(self, violation: str, message: str):
        assert violation in VIOLATION_CLASSES, violation
        super().__init__(message, violation)


class CandidateRuntimeError(HarnessError):
    status = "runtime_error"


# --------------------------------------------------------------------------------------------
# Request


@dataclass(frozen=True)
class Dist:
    kind: str
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    high: float = 1.0
    function: str | None = None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    dist: Dist | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    held_out: bool
    params: dict[str, Any]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    flops: float
    bytes: float


@dataclass(frozen=True)
class Entry:
    symbol: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    name: str
    dir: str
    reference_module: str
    reference_function: str
    baseline_name: str | None
    baseline_function: str | None
    entry: Entry | None
    forbidden: tuple[str, ...]
    # Patterns (Python regular expressions, searched) of library kernels a candidate may run
    # besides its own, on top of the backend's defaults (core.py, the kernel audit).
    allowed_kernels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidate:
    path: str
    language: str


TOLERANCE_RULES = ("scaled", "either")


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    # "scaled": |x - ref| <= atol * max|ref| + rtol * |ref|. "either" (FlashInfer-Bench's): an
    # element fails only when |x - ref| > atol and |x - ref| / (|ref| + 1e-8) > rtol.
    rule: str = "scaled"
    # The fraction of an output's elements that must be close.
    matched_ratio: float = 1.0


@dataclass(frozen=True)
class Timing:
    warmup: int
    min_reps: int
    max_reps: int
    target_seconds: float
    flush_bytes: int
    # A workload's timing stops (after min_reps) once half the width of the interval of the
    # candidate's paired ratio to the score's denominator is at most this fraction of its
    # median; 0 turns the rule off.
    precision: float = 0.0


@dataclass(frozen=True)
class Request:
    op: str
    nonce: str
    secret_seed: int
    backend: str
    task: Task | None
    candidate: Candidate | None
    build_dir: str | None
    workloads: tuple[Workload, ...]
    tolerance: dict[str, Tolerance]
    trials: int
    timing: Timing
    timeout_s: float
    raw: dict = field(repr=False, default_factory=dict)
    # How the accused process is confined: `best-effort` runs with whatever layers this
    # machine allows (the result says which), `require` refuses to run without all of them.
    sandbox: str = "best-effort"
    # Per workload, the baseline and reference times to score against (yardstick.py); `None`
    # times the baseline in the evaluation itself.
    yardstick: dict[str, dict[str, "Measured"]] | None = None
    # An evaluation of a run that will ask for profiles of its new bests: a persistent judge
    # starts the first profile's profiler once the evaluation is done (profiler.py).
    profiles_ahead: bool = False


@dataclass(frozen=True)
class Measured:
    """A median from the yardstick (a time in ns, or a ratio), its interval, and the relative
    drift between blocks of samples."""
    median: float
    lo: float
    hi: float
    spread: float = 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return (self.lo, self.hi)


class _Fields:
    """Typed access to one JSON object, with the JSON path in every error message."""

    def __init__(self, obj: Any, path: str):
        if not isinstance(obj, dict):
            raise TaskError(f"{path or 'request'}: expected an object, got {_kind(obj)}")
        self.obj = obj
        self.path = path

    def _p(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def get(self, key: str, kind: type | tuple, default: Any = ..., *, check=None) -> Any:
        if key not in self.obj or self.obj[key] is None:
            if default is ...:
                raise TaskError(f"{self._p(key)}: missing")
            return default
        value = self.obj[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds:
            raise TaskError(f"{self._p(key)}: expected {_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise TaskError(f"{self._p(key)}: expected {_names(kinds)}, got {_kind(value)}")
        if check is not None:
            problem = check(value)
            if problem:
                raise TaskError(f"{self._p(key)}: {problem}")
        return value

    def sub(self, key: str) -> "_Fields":
        return _Fields(self.get(key, dict), self._p(key))

    def items(self, key: str) -> list["_Fields"]:
        values = self.get(key, list)
        return [_Fields(v, f"{self._p(key)}[{i}]") for i, v in enumerate(values)]


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _names(kinds: tuple) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
             dict: "an object", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _positive(v: float) -> str | None:
    return None if v > 0 and math.isfinite(v) else "must be a positive number"


def _non_negative(v: float) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "must be >= 0"


def _identifier(v: str) -> str | None:
    return None if v.isidentifier() else f"`{v}` is not an identifier"


def _entry_symbol(v: str) -> str | None:
    """An identifier, possibly with `{param}` placeholders filled per workload."""
    return None if re.sub(r"\{\w+\}", "x", v).isidentifier() else \
        f"`{v}` is not an identifier (placeholders: `{{name}}`)"


def decode_request(raw: bytes) -> dict:
    """The request bytes as a JSON object (TaskError if they are not one)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"request is not UTF-8: {e}") from None
    if not text.strip():
        raise TaskError("empty request on stdin")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskError(f"request is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TaskError(f"request must be a JSON object, got {_kind(obj)}")
    return obj


def request_nonce(obj: Any) -> str | None:
    nonce = obj.get("nonce") if isinstance(obj, dict) else None
    return nonce if isinstance(nonce, str) and nonce else None


def parse_request(obj: dict, op: str) -> Request:
    """Validates a request for `op`; every problem is a TaskError naming the JSON path."""
    f = _Fields(obj, "")
    protocol = f.get("protocol", int)
    if protocol != PROTOCOL_VERSION:
        raise TaskError(f"protocol: this harness speaks version {PROTOCOL_VERSION}, got {protocol}")
    req_op = f.get("op", str)
    if req_op != op:
        raise TaskError(f"op: request says `{req_op}` but the harness was started for `{op}`")
    nonce = f.get("nonce", str, check=lambda v: None if v else "must not be empty")

    needs_task = op in ("evaluate", "check-task", "yardstick", "profile")
    needs_candidate = op in ("evaluate", "build", "profile")
    needs_workloads = op in ("evaluate", "check-task", "yardstick", "profile")

    secret_seed = f.get("secret_seed", int, ... if needs_workloads else 0,
                        check=lambda v: None if 0 <= v < 2**128 else "must be in [0, 2^128)")
    backend = f.get("backend", str, ... if needs_candidate or op == "yardstick" else "cpu")
    build_dir = f.get("build_dir", str, ... if needs_candidate else None)
    if build_dir is not None and not os.path.isabs(build_dir):
        raise TaskError(f"build_dir: must be an absolute path, got `{build_dir}`")

    task = None
    if needs_task or f.has("task"):
        task = _parse_task(f.sub("task"), require_entry=(op in ("evaluate", "profile")),
                           require_reference=needs_task)
    candidate = None
    if needs_candidate:
        c = f.sub("candidate")
        path = c.get("path", str)
        if not os.path.isabs(path):
            raise TaskError(f"candidate.path: must be an absolute path, got `{path}`")
        language = c.get("language", str, "c")
        if language.lower() not in LANGUAGES:
            raise TaskError(f"candidate.language: unknown language `{language}` "
                            f"(expected one of {', '.join(sorted(LANGUAGES))})")
        candidate = Candidate(path, LANGUAGES[language.lower()])

    workloads: tuple[Workload, ...] = ()
    if needs_workloads:
        workloads = tuple(_parse_workload(w) for w in f.items("workloads"))
        if not workloads:
            raise TaskError("workloads: empty")
        names = [w.name for w in workloads]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise TaskError(f"workloads: duplicate names {dup}")
        if task is not None and task.entry is not None:
            _check_entry_args(task.entry, workloads)

    tolerance: dict[str, Tolerance] = {}
    if f.has("tolerance"):
        tol = f.sub("tolerance")
        for dtype in tol.obj:
            if dtype not in DTYPE_NAMES:
                raise TaskError(f"tolerance.{dtype}: unknown dtype "
                                f"(expected one of {', '.join(DTYPE_NAMES)})")
            t = tol.sub(dtype)
            tolerance[dtype] = Tolerance(
                t.get("rtol", float, check=_non_negative),
                t.get("atol", float, check=_non_negative),
                t.get("rule", str, "scaled",
                      check=lambda v: None if v in TOLERANCE_RULES
                      else f"must be one of {', '.join(TOLERANCE_RULES)}"),
                t.get("matched_ratio", float, 1.0,
                      check=lambda v: None if 0.0 < v <= 1.0 else "must be in (0, 1]"))

    trials = DEFAULT_TRIALS
    if f.has("correctness"):
        trials = f.sub("correctness").get(
            "trials", int, DEFAULT_TRIALS, check=lambda v: None if v >= 1 else "must be >= 1")

    t = f.sub("timing") if f.has("timing") else _Fields({}, "timing")
    positive_int = lambda v: None if v >= 1 else "must be >= 1"  # noqa: E731
    timing = Timing(
        warmup=t.get("warmup", int, DEFAULT_TIMING["warmup"],
                     check=lambda v: None if v >= 0 else "must be >= 0"),
        min_reps=t.get("min_reps", int, DEFAULT_TIMING["min_reps"], check=positive_int),
        max_reps=t.get("max_reps", int, DEFAULT_TIMING["max_reps"], check=positive_int),
        target_seconds=t.get("target_seconds", float, DEFAULT_TIMING["target_seconds"],
                             check=_non_negative),
        flush_bytes=t.get("flush_bytes", int, DEFAULT_TIMING["flush_bytes"],
                          check=lambda v: None if v >= 0 else "must be >= 0"),
        precision=t.get("precision", float, DEFAULT_TIMING["precision"],
                        check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)"),
    )
    if timing.max_reps < timing.min_reps:
        raise TaskError(f"timing.max_reps ({timing.max_reps}) < timing.min_reps "
                        f"({timing.min_reps})")
    timeout_s = f.get("timeout_s", float, DEFAULT_TIMEOUT_S, check=_positive)
    sandbox = f.get("sandbox", str, "best-effort",
                    check=lambda v: None if v in SANDBOX_MODES
                    else f"must be one of {', '.join(SANDBOX_MODES)}")

    yardstick = _parse_yardstick(f.sub("yardstick")) if f.has("yardstick") else None
    profiles_ahead = f.get("profiles_ahead", bool, False)

    return Request(op=op, nonce=nonce, secret_seed=secret_seed, backend=backend, task=task,
                   candidate=candidate, build_dir=build_dir, workloads=workloads,
                   tolerance=tolerance, trials=trials, timing=timing, timeout_s=timeout_s,
                   raw=obj, sandbox=sandbox, yardstick=yardstick, profiles_ahead=profiles_ahead)


def _parse_yardstick(f: "_Fields") -> dict[str, dict[str, "Measured"]]:
    """An evaluate request's `yardstick` (what the yardstick op reported): per workload, the
    baseline's and the reference's median time, interval and spread (`median_ns`, `lo_ns`,
    `hi_ns`), and the median of their paired ratio (`baseline_over_reference`: `median`,
    `lo`, `hi`)."""
    out: dict[str, dict[str, Measured]] = {}
    wls = f.sub("workloads")
    positive = lambda v: None if v > 0 else "must be > 0"  # noqa: E731
    for name in wls.obj:
        w = wls.sub(name)
        entry = {}
        for key, unit in (("baseline", "_ns"), ("reference", "_ns"),
                          ("baseline_over_reference", "")):
            if not w.has(key):
                continue
            c = w.sub(key)
            m = Measured(median=c.get("median" + unit, float, check=positive),
                         lo=c.get("lo" + unit, float, check=positive),
                         hi=c.get("hi" + unit, float, check=positive),
                         spread=c.get("spread", float, 0.0, check=_non_negative))
            if not m.lo <= m.median <= m.hi:
                raise TaskError(f"yardstick.workloads.{name}.{key}: the median is not inside "
                                f"its interval")
            entry[key] = m
        out[name] = entry
    return out


def _parse_task(t: _Fields, require_entry: bool, require_reference: bool) -> Task:
    name = t.get("name", str, "task")
    tdir = t.get("dir", str, ... if require_reference else "")
    if require_reference and not os.path.isabs(tdir):
        raise TaskError(f"task.dir: must be an absolute path, got `{tdir}`")
    ref_module, ref_function = "reference.py", "reference"
    if t.has("reference"):
        r = t.sub("reference")
        ref_module = r.get("module", str, ref_module)
        ref_function = r.get("function", str, ref_function, check=_identifier)
    baseline_name = baseline_function = None
    if t.has("baseline"):
        b = t.sub("baseline")
        baseline_function = b.get("function", str, check=_identifier)
        baseline_name = b.get("name", str, baseline_function)
    entry = None
    if t.has("entry") or require_entry:
        e = t.sub("entry")
        args = e.get("args", list)
        for i, a in enumerate(args):
            if not isinstance(a, str) or not a:
                raise TaskError(f"task.entry.args[{i}]: expected a non-empty string")
        entry = Entry(e.get("symbol", str, check=_entry_symbol), tuple(args))
    forbidden = t.get("forbidden", list, [])
    for i, ident in enumerate(forbidden):
        if not isinstance(ident, str) or not ident:
            raise TaskError(f"task.forbidden[{i}]: expected a non-empty string")
    allowed = t.get("allowed_kernels", list, [])
    for i, pattern in enumerate(allowed):
        try:
            re.compile(pattern)
        except (TypeError, re.error) as e:
            raise TaskError(f"task.allowed_kernels[{i}]: not a regular expression: {e}") from None
    return Task(name, tdir, ref_module, ref_function, baseline_name, baseline_function, entry,
                tuple(forbidden), tuple(allowed))


def _parse_tensor(t: _Fields, with_dist: bool) -> TensorSpec:
    name = t.get("name", str, check=_identifier)
    dtype = t.get("dtype", str, check=lambda v: None if v in DTYPE_NAMES else
                  f"unknown dtype `{v}` (expected one of {', '.join(DTYPE_NAMES)})")
    shape = t.get("shape", list)
    for i, d in enumerate(shape):
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            raise TaskError(f"{t.path}.shape[{i}]: expected a positive integer, got {d!r}")
    dist = None
    if with_dist and t.has("dist"):
        d = t.sub("dist")
        kind = d.get("kind", str, check=lambda v: None if v in DIST_KINDS else
                      f"unknown distribution `{v}` (expected one of {', '.join(DIST_KINDS)})")
        if kind == "normal":
            dist = Dist("normal", mean=d.get("mean", float, 0.0),
                        std=d.get("std", float, 1.0, check=_non_negative))
        elif kind == "uniform":
            dist = Dist("uniform", low=d.get("low", float, 0.0), high=d.get("high", float, 1.0))
            if dist.high < dist.low:
                raise TaskError(f"{d.path}: high < low")
        elif kind in ("rand_int", "randint"):
            low, high = d.get("low", int, 0), d.get("high", int)
            if high <= low:
                raise TaskError(f"{d.path}: rand_int needs high > low (high is exclusive)")
            dist = Dist("rand_int", low=low, high=high)
        else:
            dist = Dist("custom", function=d.get("function", str, f"make_{name}",
                                                 check=_identifier))
    return TensorSpec(name, dtype, tuple(shape), dist)


def _parse_workload(w: _Fields) -> Workload:
    name = w.get("name", str, check=lambda v: None if v else "must not be empty")
    params = w.get("params", dict, {})
    for k, v in params.items():
        if not isinstance(v, (int, float, str)):
            raise TaskError(f"{w.path}.params.{k}: expected a number or string, got {_kind(v)}")
    inputs = tuple(_parse_tensor(t, True) for t in w.items("inputs"))
    outputs = tuple(_parse_tensor(t, False) for t in w.items("outputs"))
    if not outputs:
        raise TaskError(f"{w.path}.outputs: a workload needs at least one output")
    names = [t.name for t in inputs + outputs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TaskError(f"{w.path}: tensor names used twice: {dup}")
    return Workload(name=name, held_out=w.get("held_out", bool, False), params=dict(params),
                    inputs=inputs, outputs=outputs,
                    flops=w.get("flops", float, 0.0, check=_non_negative),
                    bytes=w.get("bytes", float, 0.0, check=_non_negative))


def _check_entry_args(entry: Entry, workloads: tuple[Workload, ...]) -> None:
    for w in workloads:
        for name in re.findall(r"\{(\w+)\}", entry.symbol):
            if not isinstance(w.params.get(name), str):
                raise TaskError(f"task.entry.symbol: `{{{name}}}` needs a string parameter "
                                f"`{name}` in workload `{w.name}`")
        tensors = {t.name for t in w.inputs + w.outputs}
        for a in entry.args:
            if a in tensors:
                continue
            if a not in w.params:
                raise TaskError(f"task.entry.args: `{a}` is neither a tensor nor a parameter of "
                                f"workload `{w.name}`")
            if isinstance(w.params[a], str):
                raise TaskError(f"task.entry.args: parameter `{a}` of workload `{w.name}` is a "
                                f"string and cannot be passed to a kernel")


# --------------------------------------------------------------------------------------------
# Result


class ResultBuilder:
    """The result object, filled in as the evaluation goes so a failure keeps what was learnt."""

    def __init__(self, op: str, nonce: str | None):
        self.stage = "request"
        self.data: dict[str, Any] = {
            "protocol": PROTOCOL_VERSION, "op": op, "nonce": nonce, "status": "passed",
            "violation": None, "message": "", "build": None, "environment": {},
            "seeds": {}, "workloads": [], "score": None, "log_tail": "",
        }

    def fail(self, err: HarnessError) -> None:
        self.data["status"] = err.status
        self.data["message"] = err.message
        if err.violation:
            self.data["violation"] = {"class": err.violation, "message": err.message}
        self.data["score"] = None

    def encode(self) -> bytes:
        return encode_result(self.data)


def jsonable(v: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to null."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    item = getattr(v, "item", None)  # numpy scalar
    if callable(item):
        return jsonable(item())
    if hasattr(v, "tolist"):
        return jsonable(v.tolist())
    return str(v)


def encode_result(data: dict) -> bytes:
    return (json.dumps(jsonable(data), allow_nan=False, separators=(",", ":")) + "\n").encode()


def error_result(op: str, nonce: str | None, err: HarnessError) -> dict:
    b = ResultBuilder(op, nonce)
    b.fail(err)
    return b.data


# --------------------------------------------------------------------------------------------
# Process plumbing: the private channel, stdin, and fd 1/2.


def move_fd_high(fd: int) -> int:
    """Duplicates `fd` to a random number above the low range a candidate would probe, with
    close-on-exec, and closes the original. Falls back to a plain dup when the limit is low."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = 1024
    if soft == -1 or soft > 4096:
        soft = 4096
    try:
        if soft > 200:
            lo = 100 + secrets.randbelow(max(1, soft - 150))
            new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lo)
        else:
            new = os.dup(fd)
    except OSError:
        new = os.dup(fd)
    os.close(fd)
    return new


def write_all(fd: int, data: bytes) -> None:
    """Writes all of `data` to `fd` (a pipe takes it in pieces); raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ResultChannel:
    """The one place a result line is written to."""

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def claim(cls, fd: int) -> "ResultChannel":
        os.fstat(fd)  # raises OSError if the caller passed a closed descriptor
        return cls(move_fd_high(fd))

    def send(self, line: bytes) -> None:
        write_all(self.fd, line)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def read_stdin_and_close() -> bytes:
    """Reads the whole request, then points fd 0 at /dev/null so nothing loaded later can read
    what followed (nothing should) or learn where the request came from."""
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return b"".join(chunks)


def redirect_output(log_path: str) -> None:
    """fd 1 and fd 2 to the log file: whatever a candidate prints lands there, never on a
    channel the caller reads as a result."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def log_tail(log_path: str | None, limit: int = LOG_TAIL_CHARS) -> str:
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4 * limit))
            data = fh.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")[-limit:]
