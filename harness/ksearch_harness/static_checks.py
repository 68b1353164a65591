"""Static checks on candidate source text, before anything is compiled.

They are a first, cheap layer: the runtime checks in core.py catch what text matching cannot.
C, C++ and CUDA: comments and string literals are stripped first so that explaining an idea in
a comment never rejects a kernel; the few rules that must look inside strings (inline asm,
section names, symbol aliases) say so. CUDA adds rules for host callbacks, context and device
resets, persisting-L2 controls and PyTorch headers. Python (mlx candidates) is checked on its
syntax tree, never by text matching: see `check_python`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    violation: str  # "reference_call" | "forbidden_call" | "lazy_output"
    line: int
    message: str


def strip_source(src: str, cxx: bool = False) -> tuple[str, str]:
    """Returns (code, code_with_strings): comments replaced by spaces in both, string and char
    literal contents removed from the first. Newlines are kept, so offsets map to lines."""
    code: list[str] = []
    with_strings: list[str] = []
    i, n = 0, len(src)

    def emit(text: str, literal: str | None = None) -> None:
        code.append(text if literal is None else literal)
        with_strings.append(text)

    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = i + 2
            while j < n and not (src[j] == "\n" and src[j - 1] != "\\"):
                j += 1
            blank = re.sub(r"[^\n]", " ", src[i:j])
            emit(blank)
            i = j
        elif c == "/" and nxt == "*":
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            emit(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"' and cxx and i > 0 and src[i - 1] == "R" and _raw_prefix(src, i - 1):
            m = re.match(r'"([^()\\\s]{0,16})\(', src[i:])
            if not m:
                emit(c)
                i += 1
                continue
            end = src.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            text = src[i:j]
            emit(text, '""' + "\n" * text.count("\n"))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            text = src[i:j]
            emit(text, c + c + "\n" * text.count("\n"))
            i = j
        else:
            emit(c)
            i += 1
    return "".join(code), "".join(with_strings)


def _raw_prefix(src: str, r_index: int) -> bool:
    """True when the `R` before a quote starts a C++ raw string (R, LR, uR, UR, u8R)."""
    start = r_index
    while start > 0 and (src[start - 1].isalnum() or src[start - 1] == "_"):
        start -= 1
    return src[start:r_index + 1] in ("R", "LR", "uR", "UR", "u8R")


_TIMER_FUNCTIONS = ("clock_gettime", "clock_getres", "gettimeofday", "time", "clock",
                    "timespec_get", "ftime", "times", "__clock_gettime", "__vdso_clock_gettime",
                    "__vdso_gettimeofday", "__vdso_time")
_PARAMS = r"\((?:[^;{}()]|\([^;{}()]*\))*\)"
_TIMER_DEFINITION = re.compile(
    r"(?<![\w.>:])(" + "|".join(map(re.escape, _TIMER_FUNCTIONS)) + r")\s*" + _PARAMS
    + r"\s*(?:__attribute__\s*\(\([^;{}]*\)\)\s*|noexcept\s*|throw\s*\(\s*\)\s*)*\{")

# (pattern over code without strings, message)
_CODE_RULES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"\b(dlopen|dlmopen|dlsym|dlvsym|dladdr|dlinfo)\b"),
     "dynamic loading (`{0}`) can reach code outside the candidate"),
    (re.compile(r"\b(system)\s*\("), "`system()` runs a shell"),
    (re.compile(r"(?<![\w.>])(popen|fork|vfork|clone|clone3|posix_spawn|posix_spawnp)\b"),
     "`{0}` starts another process"),
    (re.compile(r"\b(execl|execlp|execle|execv|execvp|execvpe|execve|execveat|fexecve)\b"),
     "`{0}` replaces the process image"),
    (re.compile(r"\b(syscall)\b"), "raw `syscall` bypasses the checks on library calls"),
    (re.compile(r"\b(Py_\w+|Py[A-Z][A-Za-z]*_\w+|PyObject|PyThreadState|PyGILState_\w+)\b"),
     "Python C API (`{0}`): candidates must not reach into the harness interpreter"),
    (re.compile(r"__attribute__\s*\(\([^;{}]*?\b(constructor|destructor)\b"),
     "`__attribute__(({0}))` runs code at load time, outside any timed or checked call"),
    (re.compile(r"\b(__rdtsc|__rdtscp|__builtin_ia32_rdtsc|__builtin_ia32_rdtscp|"
                r"__builtin_readcyclecounter)\b"),
     "reading the cycle counter (`{0}`) is a timer"),
)

# (pattern over code with strings kept, message)
_STRING_RULES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"\b(rdtscp?|rdpmc)\b"), "inline `{0}` reads a hardware timer"),
    (re.compile(r"\.(init_array|preinit_array|fini_array|ctors|dtors)\b"),
     "placing code in `.{0}` runs it at load time"),
    (re.compile(r'"(' + "|".join(map(re.escape, _TIMER_FUNCTIONS[:3] + _TIMER_FUNCTIONS[8:]))
                + r')"'),
     "timer symbol `{0}` named in a string (alias or lookup)"),
)

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_FORBIDDEN_HEADERS = {"Python.h": "the Python C API", "dlfcn.h": "dynamic loading",
                      "spawn.h": "process creation"}


# CUDA only: (pattern over code without strings, message)
_CUDA_RULES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"\b(cudaLaunchHostFunc|cudaStreamAddCallback|cuLaunchHostFunc|"
                r"cuStreamAddCallback)\b"),
     "`{0}` runs host code on a driver thread after the call has returned"),
    (re.compile(r"\b(cudaDeviceReset|cudaSetDevice|cudaSetDeviceFlags|cudaSetValidDevices|"
                r"cudaDeviceSetLimit|cudaDeviceSetCacheConfig|cudaDeviceSetSharedMemConfig|"
                r"cuCtx\w+|cuDevicePrimaryCtx\w+)\b"),
     "`{0}` changes the device or context the harness shares with the candidate"),
    (re.compile(r"\b(accessPolicyWindow|cudaLimitPersistingL2CacheSize|"
                r"cudaStreamAttributeAccessPolicyWindow|cudaCtxResetPersistingL2Cache|"
                r"cudaAccessPropertyPersisting)\b"),
     "persisting-L2 control (`{0}`) keeps data cached across timed calls, defeating the "
     "cache flush between them"),
    (re.compile(r"\b(cudaProfilerStart|cudaProfilerStop)\b"),
     "`{0}` controls the profiler the harness may use"),
)
_CUDA_HEADER_ROOTS = {"torch": "PyTorch", "ATen": "PyTorch", "c10": "PyTorch",
                      "caffe2": "PyTorch"}


def check_source(src: str, forbidden: tuple[str, ...] | list[str], language: str = "c"
                 ) -> list[Finding]:
    """All findings, reference calls first. An empty list means the source passed."""
    if language == "python":
        return check_python(src, forbidden)
    code, with_strings = strip_source(src, cxx=language in ("c++", "cuda"))
    findings: list[Finding] = []

    def line_of(text: str, pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for ident in forbidden:
        m = re.search(r"(?<![\w$])" + re.escape(ident) + r"(?![\w$])", code)
        if m:
            findings.append(Finding("reference_call", line_of(code, m.start()),
                                    f"mentions `{ident}`, which the task reserves for its "
                                    f"reference or baseline"))
    for m in _INCLUDE.finditer(with_strings):
        header = m.group(1).strip()
        base = header.rsplit("/", 1)[-1]
        why = _FORBIDDEN_HEADERS.get(base)
        if why is None and (header.startswith("/") or ".." in header.split("/")):
            why = "a file outside the compiler's include path"
        if why is None and header.split("/")[0] in ("pybind11", "numpy"):
            why = "the Python C API"
        if why:
            findings.append(Finding("forbidden_call", line_of(with_strings, m.start()),
                                    f"includes `{header}` ({why})"))
    for pattern, message in _CODE_RULES:
        m = pattern.search(code)
        if m:
            findings.append(Finding("forbidden_call", line_of(code, m.start()),
                                    message.format(m.group(1))))
    m = _TIMER_DEFINITION.search(code)
    if m:
        findings.append(Finding("forbidden_call", line_of(code, m.start()),
                                f"defines the libc timer function `{m.group(1)}`, which would "
                                f"shadow the clock the harness measures with"))
    for pattern, message in _STRING_RULES:
        m = pattern.search(with_strings)
        if m:
            findings.append(Finding("forbidden_call", line_of(with_strings, m.start()),
                                    message.format(m.group(1))))
    if language == "cuda":
        for pattern, message in _CUDA_RULES:
            m = pattern.search(code)
            if m:
                findings.append(Finding("forbidden_call", line_of(code, m.start()),
                                        message.format(m.group(1))))
        for m in _INCLUDE.finditer(with_strings):
            root = m.group(1).strip().split("/")[0]
            if root in _CUDA_HEADER_ROOTS:
                findings.append(Finding("forbidden_call", line_of(with_strings, m.start()),
                                        f"includes `{m.group(1).strip()}`: "
                                        f"{_CUDA_HEADER_ROOTS[root]} belongs to the harness"))
    findings.sort(key=lambda f: (f.violation != "reference_call", f.line))
    return findings


# --------------------------------------------------------------------------------------------
# Python (mlx candidates)

# Top-level modules an mlx candidate may import; of mlx itself only `mlx.core` (whose `fast`
# submodule may contribute nothing but the kernel builders).
PY_ALLOWED_MODULES = frozenset({
    "mlx", "math", "functools", "itertools", "operator", "hashlib", "textwrap", "string",
    "typing", "dataclasses", "enum", "collections", "__future__",
})
MLX_KERNEL_BUILDERS = ("cuda_kernel", "metal_kernel")
_PY_IMPORT_WHY = {
    "torch": "PyTorch is the harness's, not the candidate's", "numpy": "host arrays bypass MLX",
    "os": "process and file access", "sys": "interpreter state", "subprocess": "other processes",
    "ctypes": "calls into native code", "cffi": "calls into native code",
    "threading": "background threads", "multiprocessing": "other processes",
    "concurrent": "background threads", "asyncio": "deferred work",
    "importlib": "dynamic imports", "builtins": "the interpreter's builtins",
    "inspect": "harness frames", "gc": "harness objects", "time": "timers",
    "signal": "signal handlers", "socket": "the network", "pickle": "code from data",
    "ksearch_harness": "the harness itself", "atexit": "code after the evaluation",
}
# Built-in names that run code from data, reach into namespaces, or do I/O.
_PY_BANNED_BUILTINS = {
    "eval": "runs code from a string", "exec": "runs code from a string",
    "compile": "builds code from a string", "__import__": "imports dynamically",
    "open": "file access", "globals": "reaches into module namespaces",
    "locals": "reaches into frames", "vars": "reaches into namespaces",
    "getattr": "looks attributes up by computed names",
    "setattr": "monkey-patches objects", "delattr": "monkey-patches objects",
    "breakpoint": "enters a debugger", "input": "reads stdin", "exit": "ends the process",
    "quit": "ends the process",
}
_PY_SHADOWABLE = frozenset({"input", "exit", "quit"})
# mlx.core names, beyond mx.fast, a candidate must not touch.
_MLX_BANNED = {
    "async_eval": "`mx.async_eval` returns before the work is done (deferred work)",
    "new_stream": "streams", "stream": "streams", "Stream": "streams",
    "StreamContext": "streams", "default_stream": "streams", "set_default_stream": "streams",
    "set_default_device": "the default device", "cpu": "running on the CPU device",
    "load": "file access", "save": "file access", "savez": "file access",
    "savez_compressed": "file access", "save_gguf": "file access",
    "save_safetensors": "file access", "import_function": "graphs loaded from files",
    "export_function": "file access", "exporter": "file access", "export_to_dot": "file access",
    "set_memory_limit": "process-wide MLX state", "set_cache_limit": "process-wide MLX state",
    "set_wired_limit": "process-wide MLX state", "clear_cache": "process-wide MLX state",
    "disable_compile": "process-wide MLX state", "enable_compile": "process-wide MLX state",
}
# Protocols through which an object pretends to be an array and computes when inspected.
_LAZY_DUNDERS = frozenset({
    "__array__", "__array_interface__", "__array_struct__", "__array_priority__",
    "__array_function__", "__array_ufunc__", "__dlpack__", "__dlpack_device__", "__buffer__",
    "__getattr__", "__getattribute__", "__float__", "__index__", "__mlx_array__",
})
_ALLOWED_DUNDER_NAMES = frozenset({"__name__"})


def check_python(src: str, forbidden: tuple[str, ...] | list[str] = ()) -> list[Finding]:
    """Rules for an mlx candidate module, on its syntax tree: the request's forbidden names
    (the task's native op, its reference and baseline) anywhere they are used as names;
    imports outside a small allowlist (no torch, numpy, os, subprocess, ctypes, threading...);
    `mx.fast` beyond `cuda_kernel`/`metal_kernel`; `mx.async_eval`, streams, devices, file
    I/O and process-wide MLX settings; monkey-patching (assigning to or deleting attributes of
    imported modules, `setattr`); `eval`/`exec`/`compile`/`__import__` and friends; dunder
    attribute access; and classes that could stand in for arrays (`lazy_output`). A source
    that does not parse yields no findings: the build reports the syntax error."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return []
    return _PyChecker(set(forbidden)).run(tree)


def kernel_dialects(src: str) -> set[str]:
    """The MLX kernel builders a module uses: {"cuda"}, {"metal"}, both or none."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return set()
    checker = _PyChecker(set())
    checker.collect_aliases(tree)
    found = set()
    for node in ast.walk(tree):
        q = checker.qualname(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if q in ("mlx.core.fast.cuda_kernel", "mlx.core.fast.metal_kernel"):
            found.add(q.rsplit(".", 1)[1].split("_")[0])
    return found


class _PyChecker:
    def __init__(self, forbidden: set[str]):
        self.forbidden = forbidden
        self.aliases: dict[str, str] = {}  # local name -> qualified module path
        self.bound: set[str] = set()  # names the module binds itself (they shadow builtins)
        self.findings: list[Finding] = []

    def add(self, violation: str, node: ast.AST, message: str) -> None:
        self.findings.append(Finding(violation, getattr(node, "lineno", 1), message))

    # -- names ---------------------------------------------------------------------------

    def collect_aliases(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        # `f = mx.fast` makes `f` a module alias too (flow-insensitive, to a fixed point).
        changed = True
        while changed:
            changed = False
            for node in ast.walk(tree):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)):
                    q = self.qualname(node.value)
                    name = node.targets[0].id
                    if q is not None and self.aliases.get(name) != q:
                        self.aliases[name] = q
                        changed = True

    def qualname(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return None

    # -- rules ---------------------------------------------------------------------------

    def run(self, tree: ast.AST) -> list[Finding]:
        self.collect_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
        self.bound |= set(self.aliases)
        for node in ast.walk(tree):
            self.visit(node)
        self.findings.sort(key=lambda f: (f.violation != "reference_call", f.line))
        return self.findings

    def mention(self, node: ast.AST, name: str | None) -> None:
        if name and name in self.forbidden:
            self.add("reference_call", node, f"uses `{name}`, which the task reserves for its "
                     f"reference, its baseline or the native op it is compared with")

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self.check_module(node, a.name)
                for part in a.name.split("."):
                    self.mention(node, part)
                self.mention(node, a.asname)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                self.add("forbidden_call", node, "relative imports reach outside the candidate")
                return
            module = node.module or ""
            self.check_module(node, module)
            for a in node.names:
                if a.name == "*":
                    self.add("forbidden_call", node, f"`from {module} import *` hides which "
                             f"names the candidate uses")
                    continue
                self.mention(node, a.name)
                self.mention(node, a.asname)
                self.check_qualified(node, f"{module}.{a.name}")
        elif isinstance(node, ast.Name):
            self.mention(node, node.id)
            # A module may reuse a harmless builtin's name for its own variable; the ones that
            # run or reach code are flagged however they are bound.
            if node.id in _PY_BANNED_BUILTINS and not (node.id in _PY_SHADOWABLE
                                                       and node.id in self.bound):
                self.add("forbidden_call", node,
                         f"`{node.id}` {_PY_BANNED_BUILTINS[node.id]}")
            elif (_dunder(node.id) and isinstance(node.ctx, ast.Load)
                  and node.id not in _ALLOWED_DUNDER_NAMES):
                self.add("forbidden_call", node, f"`{node.id}` reaches into the interpreter")
        elif isinstance(node, ast.Attribute):
            self.mention(node, node.attr)
            if _dunder(node.attr):
                self.add("forbidden_call", node, f"attribute `{node.attr}` reaches into object "
                         f"internals")
            q = self.qualname(node)
            if q is not None:
                self.check_qualified(node, q)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.mention(node, node.name)
            if isinstance(node, ast.AsyncFunctionDef):
                self.add("forbidden_call", node, "async functions defer work past the call")
            if isinstance(node, ast.ClassDef):
                self.check_class(node)
        elif isinstance(node, ast.arg):
            self.mention(node, node.arg)
        elif isinstance(node, ast.keyword):
            self.mention(node, node.arg)
            if node.arg == "stream":
                self.add("forbidden_call", node, "`stream=`: candidates run on the default "
                         "stream, where the harness waits for them")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                       else [node.target])
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)):
                        base = sub.value
                        q = self.qualname(base)
                        if q is not None:
                            self.add("forbidden_call", node, f"monkey-patching: changes "
                                     f"`{q}` (an imported module or one of its members)")
                            break

    def check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if root not in PY_ALLOWED_MODULES:
            why = _PY_IMPORT_WHY.get(root)
            self.add("forbidden_call", node, f"imports `{module}`" + (f" ({why})" if why else "")
                     + f"; mlx candidates may import only "
                     f"{', '.join(sorted(PY_ALLOWED_MODULES - {'__future__'}))}")
        elif root == "mlx" and module not in ("mlx", "mlx.core", "mlx.core.fast"):
            self.add("forbidden_call", node, f"imports `{module}`: of MLX only `mlx.core` is "
                     f"available (layers such as mlx.nn call the native ops)")

    def check_qualified(self, node: ast.AST, q: str) -> None:
        parts = q.split(".")
        if parts[0] != "mlx":
            return
        if len(parts) >= 2 and parts[1] != "core":
            self.add("forbidden_call", node, f"`{q}`: of MLX only `mlx.core` is available")
            return
        rest = parts[2:]
        if not rest:
            return
        if rest[0] == "fast" and len(rest) >= 2 and rest[1] not in MLX_KERNEL_BUILDERS:
            self.add("forbidden_call", node, f"`mx.fast.{rest[1]}`: of mx.fast a candidate may "
                     f"use only the custom-kernel builders ({', '.join(MLX_KERNEL_BUILDERS)})")
        elif rest[0] in _MLX_BANNED:
            self.add("forbidden_call", node, f"`mx.{rest[0]}`: {_MLX_BANNED[rest[0]]}")
        elif rest[0] in ("metal", "cuda") and len(rest) >= 2 and rest[1] != "is_available":
            self.add("forbidden_call", node, f"`mx.{rest[0]}.{rest[1]}`: only "
                     f"`mx.{rest[0]}.is_available` is available")

    def check_class(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            q = self.qualname(base)
            if q is not None and q.startswith("mlx.core.array"):
                self.add("lazy_output", node, f"class `{node.name}` subclasses mx.array: "
                         f"outputs must be plain mx.array objects")
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and item.name in _LAZY_DUNDERS:
                self.add("lazy_output", item, f"class `{node.name}` defines `{item.name}`, "
                         f"so its objects can pose as arrays and compute when inspected")
            if isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id in _LAZY_DUNDERS:
                        self.add("lazy_output", item, f"class `{node.name}` sets `{t.id}`")


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")
