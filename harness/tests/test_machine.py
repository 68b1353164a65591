"""The machine figures behind floors and fractions of peak: the best plausible measurement is
remembered per machine, so a measurement taken while the machine was busy never lowers them."""

from __future__ import annotations

from ksearch_harness import machine


def test_the_best_plausible_figures_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    key = "cpu:test"
    assert machine.remembered_roofline(key, lambda: (20e9, 300e9)) == (20e9, 300e9)
    # A busy machine measures less; the remembered figures stand.
    assert machine.remembered_roofline(key, lambda: (8e9, 5.7e9)) == (20e9, 300e9)
    # A better measurement replaces them; an implausible one is ignored.
    assert machine.remembered_roofline(key, lambda: (25e9, 1e30)) == (25e9, 300e9)
    assert machine.remembered_roofline(key, lambda: (1.0, 1.0)) == (25e9, 300e9)
    # Another machine (key) starts from its own measurement.
    assert machine.remembered_roofline("cpu:other", lambda: (1e9, 2e9)) == (1e9, 2e9)


def test_without_a_cache_each_measurement_stands(monkeypatch):
    monkeypatch.delenv("KSEARCH_HARNESS_MACHINE_CACHE", raising=False)
    assert machine.remembered_roofline("k", lambda: (1e9, 2e9)) == (1e9, 2e9)
    assert machine.remembered_roofline("k", lambda: (3e9, 1e9)) == (3e9, 1e9)
