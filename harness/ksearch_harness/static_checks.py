"""Static checks on candidate source text, before anything is compiled.

They are a first, cheap layer: the runtime checks in core.py catch what text matching cannot.
Comments and string literals are stripped first so that explaining an idea in a comment never
rejects a kernel; the few rules that must look inside strings (inline asm, section names,
symbol aliases) say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    violation: str  # "reference_call" | "forbidden_call"
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


def check_source(src: str, forbidden: tuple[str, ...] | list[str], language: str = "c"
                 ) -> list[Finding]:
    """All findings, reference calls first. An empty list means the source passed."""
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
    findings.sort(key=lambda f: (f.violation != "reference_call", f.line))
    return findings
