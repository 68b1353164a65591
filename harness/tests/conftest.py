"""Shared fixtures. The cheat corpus is evaluated once per session, two harness processes at a
time (the suite must stay fast on a 2-core machine); the parametrized tests read the verdicts."""

from __future__ import annotations

import sys

# The harness tree is embedded in the ksearch binary: keep bytecode caches out of it.
sys.dont_write_bytecode = True

import shutil  # noqa: E402
import tempfile  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402

import driver  # noqa: E402
from cheat_table import EXPECTED  # noqa: E402


@pytest.fixture(scope="session")
def corpus_results():
    root = tempfile.mkdtemp(prefix="ksearch-cheats-")

    def one(name: str):
        status, _cls, timeout_s, *more = EXPECTED[name]
        build_dir = f"{root}/{name[:-2]}"
        req = driver.softmax_request(driver.CHEATS / name, build_dir, timeout_s=timeout_s,
                                     **(more[0] if more else {}))
        return name, driver.run_harness("evaluate", req, timeout=timeout_s + 60,
                                        env={"KSEARCH_TEST_SECRET": driver.CANARY})

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            yield dict(pool.map(one, sorted(EXPECTED)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
