"""What each file of the cheat corpus must be judged: (status, violation class, timeout_s of
its request), and for some a fourth element: overrides of the request (driver.softmax_request).
"""

import driver

# Calls of about ten milliseconds: a tampered clock is told from the judge's own only when the
# difference is larger than what a round trip costs, which the shown workloads are not.
LONG_CALLS = {"workloads": [driver.workload(1024, 4096), driver.workload(7, 333, held_out=True)]}

EXPECTED = {
    "writes_nothing.c": ("integrity_violation", "output_not_written", 60),
    "partial_write.c": ("integrity_violation", "output_not_written", 60),
    "stale_static_buffer.c": ("integrity_violation", "stale_output", 60),
    "pointer_cache.c": ("integrity_violation", "stale_output", 60),
    "value_hash_cache.c": ("integrity_violation", "stale_output", 60),
    "mutates_input.c": ("integrity_violation", "input_mutated", 60),
    # Work left on a thread after return shows as late output writes (deferred_work) or as a
    # thread still busy in the settle window (lingering_work), whichever the judge sees first.
    # (or, when the thread is slower than the judge's settle window, as outputs left unwritten).
    "deferred_pthread.c": (("integrity_violation",) * 3,
                           ("deferred_work", "lingering_work", "output_not_written"), 60),
    "half_precision.c": ("integrity_violation", "precision", 60),
    "shape_special.c": ("integrity_violation", "shape_specialisation", 60),
    "imprecise_tail.c": ("integrity_violation", "precision", 60),
    "calls_reference.c": ("static_check_failed", "reference_call", 60),
    "calls_dlopen_system.c": ("static_check_failed", "forbidden_call", 60),
    "defines_clock_gettime.c": ("static_check_failed", "forbidden_call", 60),
    "phase_garbage.c": ("integrity_violation", "phase_dependent", 60),
    # Its timed calls return before the thread writes: late writes, a busy thread, or, when the
    # thread is slower than the settle window, unwritten outputs only in the timed phase.
    "sleeps_first_calls.c": (("integrity_violation",) * 4,
                             ("deferred_work", "lingering_work", "output_not_written",
                              "phase_dependent"), 60),
    # What uninitialised scratch holds depends on the allocator (glibc's tcache path skips the
    # M_PERTURB fill the harness sets), so the two calls on identical inputs usually disagree
    # (nondeterministic) but can also be wrong the same way (plain incorrect). Both reject it.
    "uninit_scratch.c": (("integrity_violation", "incorrect"), ("nondeterministic", None), 60),
    "infinite_loop.c": ("timeout", None, 3),
    "segfault.c": ("runtime_error", None, 60),
    "forged_result.c": ("integrity_violation", "result_channel", 60),
    "forged_channel_frame.c": ("integrity_violation", "result_channel", 60),
    "python_timer_patch.c": ("integrity_violation", "timer_tampering", 120, LONG_CALLS),
    "precompute_thread.c": ("integrity_violation", "lingering_work", 60),
    "spin_threads.c": ("integrity_violation", "lingering_work", 60),
    # Tries sandbox escapes and computes correctly: it passes, and test_sandboxed_escapes reads
    # what it managed. Without a sandbox its child process outlives a call (lingering_work).
    "escape_attempts.c": (("passed", "integrity_violation"), (None, "lingering_work"), 60),
    # Includes /proc/*/environ through macros; test_cheats checks no secret reached the log.
    "include_environ.c": (("build_error", "passed"), (None, None), 60),
}
