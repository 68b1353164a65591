"""Static checks: comment/string stripping and each rule, with and without false alarms."""

from __future__ import annotations

import pytest

from ksearch_harness.static_checks import check_source, strip_source

FORBIDDEN = ("reference", "baseline_numpy")


def classes(src: str, language: str = "c") -> list[str]:
    return [f.violation for f in check_source(src, FORBIDDEN, language)]


def test_strip_keeps_lines_and_removes_comments_and_strings():
    src = 'int a; // reference\n/* dlopen\n system( */ const char* s = "popen";\nchar c = \'"\';'
    code, with_strings = strip_source(src)
    assert code.count("\n") == src.count("\n")
    assert "reference" not in code and "dlopen" not in code and "popen" not in code
    assert '"popen"' in with_strings and "dlopen" not in with_strings
    assert "char c = '';" in code  # a quote inside a char literal does not open a string


def test_escaped_quotes_and_line_continued_comments():
    code, _ = strip_source('const char* s = "a\\"dlopen"; // x \\\n system(1);\nint k;')
    assert "dlopen" not in code and "system" not in code and "int k;" in code


def test_cpp_raw_strings_are_strings():
    src = 'auto s = R"xy(fork() "quoted" )xy"; int fork_count;'
    assert classes(src, "c++") == []
    code, _ = strip_source(src, cxx=True)
    assert "fork()" not in code and "fork_count" in code


@pytest.mark.parametrize("src", [
    "/* calls reference() for checking */ void k(void) {}",
    "// baseline_numpy is slower\nvoid k(void) {}",
    'const char* why = "not the reference";',
    "int reference_count; int my_reference = 0; double preference;",
    "void k(float* timeout) { float t = time_scale(timeout); }",
    "int clocks; double runtime(int x) { return x; }",
    "x = obj.clone(); y = p->fork;",
    "double elapsed = my_clock_gettime_wrapper(1);",
])
def test_benign_sources_pass(src):
    assert classes(src) == []


@pytest.mark.parametrize("src,cls", [
    ("void k(void) { reference(0); }", "reference_call"),
    ("extern void baseline_numpy(void);", "reference_call"),
    ('void* h = dlopen("libm.so", 2);', "forbidden_call"),
    ("void* f = dlsym(h, name);", "forbidden_call"),
    ('int r = system("ls");', "forbidden_call"),
    ('FILE* p = popen(cmd, "r");', "forbidden_call"),
    ("pid_t p = fork();", "forbidden_call"),
    ("execvp(argv[0], argv);", "forbidden_call"),
    ("long r = syscall(228, 1, &ts);", "forbidden_call"),
    ("#include <Python.h>\nvoid k(void) {}", "forbidden_call"),
    ('#include "/etc/passwd"', "forbidden_call"),
    ("void k(void) { Py_Initialize(); }", "forbidden_call"),
    ("PyObject* o = 0;", "forbidden_call"),
    ("__attribute__((constructor)) static void init(void) {}", "forbidden_call"),
    ("static void fini(void) __attribute__((used, destructor(101)));", "forbidden_call"),
    ("int clock_gettime(int c, struct timespec* t) { return 0; }", "forbidden_call"),
    ("int gettimeofday(struct timeval* tv, void* tz)\n{\n return 0; }", "forbidden_call"),
    ("time_t time(time_t* t) { return 0; }", "forbidden_call"),
    ('static inline unsigned long long tsc(void) { unsigned a, d; '
     '__asm__ volatile("rdtsc" : "=a"(a), "=d"(d)); return a; }', "forbidden_call"),
    ("unsigned long long t = __rdtsc();", "forbidden_call"),
    ('__attribute__((section(".init_array"))) void (*p)(void) = f;', "forbidden_call"),
    ('int ts(void) __attribute__((alias("clock_gettime")));', "forbidden_call"),
])
def test_forbidden_sources_are_flagged(src, cls):
    assert cls in classes(src)


def test_calling_a_timer_is_not_defining_it():
    src = "void k(void) { struct timespec t; clock_gettime(1, &t); if (time(0)) { } }"
    assert classes(src) == []


def test_findings_report_lines_and_reference_first():
    src = "int a;\nint b;\nvoid* h = dlopen(0, 0);\nvoid k(void) { reference(); }\n"
    findings = check_source(src, FORBIDDEN)
    assert [(f.violation, f.line) for f in findings] == [("reference_call", 4),
                                                         ("forbidden_call", 3)]
