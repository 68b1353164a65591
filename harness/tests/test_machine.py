"""The machine figures behind floors and fractions of peak: measured once per machine and
remembered, so every evaluation uses the same ones; only a better measurement replaces them."""

from __future__ import annotations

import pytest

from ksearch_harness import machine


def test_figures_are_measured_once_and_only_improved(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    key = "cpu:test"
    assert machine.remembered_roofline(key, lambda: (20e9, 300e9)) == (20e9, 300e9)

    def never():
        raise AssertionError("measured again")

    assert machine.remembered_roofline(key, never) == (20e9, 300e9)
    # A busy machine's lower figures and an implausible one change nothing; a better one does.
    machine.remember_roofline(key, 8e9, 5.7e9)
    machine.remember_roofline(key, 25e9, 1e30)
    assert machine.remembered_roofline(key, never) == (25e9, 300e9)
    # Another machine (key) is measured on its own.
    assert machine.remembered_roofline("cpu:other", lambda: (1e9, 2e9)) == (1e9, 2e9)


def test_implausible_remembered_figures_are_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    machine.remember_roofline("k", 1.0, 1.0)  # below every plausible value: not kept
    assert machine.remembered_roofline("k", lambda: (3e9, 4e9)) == (3e9, 4e9)


def test_without_a_cache_each_evaluation_measures(monkeypatch):
    monkeypatch.delenv("KSEARCH_HARNESS_MACHINE_CACHE", raising=False)
    assert machine.remembered_roofline("k", lambda: (1e9, 2e9)) == (1e9, 2e9)
    assert machine.remembered_roofline("k", lambda: (3e9, 1e9)) == (3e9, 1e9)
    machine.remember_roofline("k", 5e9, 5e9)  # nowhere to keep it: no error


@pytest.mark.parametrize("bw, peak", [(0.0, 1e9), (float("nan"), 1e9)])
def test_a_failed_measurement_is_not_remembered(tmp_path, monkeypatch, bw, peak):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    machine.remember_roofline("k", bw, peak)
    assert machine.remembered_roofline("k", lambda: (2e9, 3e9)) == (2e9, 3e9)
