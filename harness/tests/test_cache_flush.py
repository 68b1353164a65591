"""The cpu backend's cache flush (cache_flush.py): every CPU the judge may use gets its share,
written by a thread pinned there, so no core keeps a candidate's data warm."""

from __future__ import annotations

import pytest

from ksearch_harness import cache_flush
from ksearch_harness.cache_flush import MIN_PER_CPU, CacheFlush


def test_each_cpu_of_the_judge_is_flushed_by_a_thread_running_there():
    cpus = cache_flush.allowed_cpus()
    if len(cpus) < 2 or cache_flush.current_cpu() is None:
        pytest.skip("one CPU (or no sched_getcpu): the judge's own thread flushes it")
    f = CacheFlush(4 << 20, cpus)
    for k in range(1, 4):
        f.flush()
        # Every share was read and written once more, by the thread of its CPU.
        assert [int(b[0]) for b in f.buffers] == [k] * len(cpus)
        assert [int(b[-1]) for b in f.buffers] == [k] * len(cpus)
        assert f.ran_on == cpus
    # Each share is larger than any core's private caches, whatever the total asked for.
    assert all(b.nbytes >= MIN_PER_CPU for b in f.buffers)
    assert sum(b.nbytes for b in CacheFlush(1 << 30, cpus).buffers) >= 1 << 30


def test_one_cpu_is_flushed_by_the_calling_thread():
    f = CacheFlush(1 << 20, [0])
    f.flush()
    f.flush()
    assert len(f.buffers) == 1 and f.buffers[0].nbytes == 1 << 20
    assert int(f.buffers[0][0]) == 2 and f.ran_on == []


def test_a_process_keeps_one_flush_per_size():
    assert cache_flush.flusher(2 << 20) is cache_flush.flusher(2 << 20)
    assert cache_flush.flusher(2 << 20) is not cache_flush.flusher(3 << 20)

