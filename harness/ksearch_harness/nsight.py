"""Nsight Compute counters of a candidate's own kernels, reduced to what ksearch interprets.

ksearch classifies a kernel against the hardware's speed of light (crates/eval/src/bottleneck.rs)
from its time and the task's roofline model; counters, where a profiler ran, take precedence:
DRAM and SM throughput as percent of peak, tensor-pipe activity, achieved occupancy and what
limits it, registers per thread and the bytes moved from DRAM. This module owns the three pure
steps around `ncu`, so that they are tested without a GPU:

- `command` is the ncu command line that collects exactly those metrics for a process as a
  raw CSV page, in base units (no thousands scaling), written to a log file;
- `parse_raw_csv` reads that page into one record per profiled launch;
- `reduce` combines the launches of the candidate's kernels into one set of counters (percentages
  weighted by each launch's time, bytes summed, the largest register count, the occupancy
  limiter of the longest launch, the top stall reasons with their share of stall cycles).

Which launches are the candidate's is the caller's to say (the kernel audit's names): inputs are
made and checked by other kernels (PyTorch's fills and copies), which must not be counted.
"""
from __future__ import annotations

import csv
import io
from typing import Callable, Iterable

# The counters ksearch reads, by the name of the field they fill (bottleneck::Counters).
METRICS = {
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "compute_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "dram_bytes": "dram__bytes.sum",
}
# A launch's duration: the weight of its percentages.
TIME = "gpu__time_duration.sum"
# Blocks per SM each resource allows; the smallest names what limits occupancy.
LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
}
# Why warps wait: per reason, the cycles a warp spends stalled on it per instruction issued
# (ncu's warp state statistics). "selected", the warp issuing, is not a stall.
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss",
                 "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle",
                 "misc", "no_instruction", "not_selected", "short_scoreboard", "sleeping",
                 "tex_throttle", "wait")
STALLS = {reason.replace("_", " "):
          f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
          for reason in STALL_REASONS}
# How many stall reasons a reduction keeps, largest first.
TOP_STALLS = 3
ALL_METRICS = (*METRICS.values(), TIME, *LIMITS.values(), *STALLS.values())
# The fields that are percentages of a peak (averaged over launches, weighted by time).
PERCENTAGES = tuple(field for field in METRICS if field.endswith("_pct"))
# The units ncu's raw page gives in base units, where a scaled unit would mislead.
BASE_UNITS = {
    METRICS["dram_bytes"]: ("byte",),
    TIME: ("ns", "nsecond"),
    **{METRICS[field]: ("%",) for field in PERCENTAGES},
}


class NsightError(Exception):
    """ncu's output is not the raw CSV page this module asked for."""


def command(ncu: str, log_file: str, argv: list[str], kernel_regex: str | None = None,
            from_start: bool = True) -> list[str]:
    """The ncu command that profiles every launch of `argv` (its child processes included) for
    `ALL_METRICS`, as a raw CSV page in base units, into `log_file` (the profiled process's own
    output stays on its stdout/stderr, apart from the counters). `kernel_regex` limits the
    launches profiled, by function name; without `from_start`, only the launches between the
    process's cuProfilerStart and cuProfilerStop are profiled."""
    cmd = [ncu, "--csv", "--page", "raw", "--print-units", "base", "--target-processes", "all",
           "--metrics", ",".join(ALL_METRICS), "--log-file", log_file]
    if not from_start:
        cmd += ["--profile-from-start", "off"]
    if kernel_regex:
        cmd += ["--kernel-name-base", "function", "--kernel-name", f"regex:{kernel_regex}"]
    return cmd + list(argv)


def _number(text: str) -> float | None:
    """A CSV cell as a number: thousands separators dropped; `n/a` and empty cells are None."""
    t = text.strip().replace(",", "")
    if not t or t.lower() == "n/a":
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict]:
    """One record per profiled launch of ncu's raw page: `kernel` (its name) and each metric of
    `ALL_METRICS` present, as a float or None. Lines before the header (ncu's `==PROF==` notes)
    are skipped; the second row, the units, is not a launch."""
    rows = csv.reader(io.StringIO("\n".join(
        line for line in text.splitlines() if line.startswith('"'))))
    launches = []
    header: list[str] = []
    for row in rows:
        if row and row[0] == "ID":
            # A header, perhaps not the first (one per page ncu printed): columns anew.
            header = row
            if "Kernel Name" not in header:
                raise NsightError("ncu's raw page has no `Kernel Name` column")
            name_at = header.index("Kernel Name")
            at = {m: header.index(m) for m in ALL_METRICS if m in header}
            continue
        if not header or len(row) != len(header):
            continue  # before a header, or a line cut short
        if not row[name_at]:
            # The units row: the figures must be in the base units the command asked for.
            for m, i in at.items():
                if m in BASE_UNITS and row[i] not in BASE_UNITS[m]:
                    raise NsightError(f"{m} is in {row[i]!r}, not in base units: was ncu run "
                                      "with --print-units base?")
            continue
        launches.append({"kernel": row[name_at], **{m: _number(row[i]) for m, i in at.items()}})
    if not header:
        raise NsightError("no raw CSV header (a line starting with \"ID\") in ncu's output")
    return launches


def reduce(launches: Iterable[dict], own: Callable[[str], bool]) -> dict:
    """The counters of the launches whose kernel `own` accepts, as bottleneck::Counters fields
    (absent where no launch had the metric): percentages as a time-weighted mean, `dram_bytes`
    summed, `registers` the largest, `occupancy_limiter` the smallest limit of the longest
    launch, `stalls` the top reasons why warps waited (see `_stall_shares`). Empty when no
    launch is the candidate's."""
    mine = [l for l in launches if own(l["kernel"])]
    if not mine:
        return {}
    out: dict = {"launches": len(mine)}
    weight = [l.get(TIME) or 0.0 for l in mine]
    if not any(weight):
        weight = [1.0] * len(mine)
    for field in PERCENTAGES:
        mean = _weighted_mean(mine, weight, METRICS[field])
        if mean is not None:
            out[field] = mean
    regs = [l[METRICS["registers"]] for l in mine if l.get(METRICS["registers"]) is not None]
    if regs:
        out["registers"] = int(max(regs))
    moved = [l[METRICS["dram_bytes"]] for l in mine if l.get(METRICS["dram_bytes"]) is not None]
    if moved:
        out["dram_bytes"] = sum(moved)
    longest = max(zip(mine, weight), key=lambda p: p[1])[0]
    limits = [(longest.get(m), name) for name, m in LIMITS.items() if longest.get(m) is not None]
    if limits:
        out["occupancy_limiter"] = min(limits, key=lambda p: p[0])[1]
    stalls = _stall_shares(mine, weight)
    if stalls:
        out["stalls"] = stalls
    return out


def _weighted_mean(launches: list[dict], weight: list[float], metric: str) -> float | None:
    """`metric` averaged over the launches that have it, weighted by `weight` (their times);
    None where none has it with a positive weight."""
    pairs = [(l[metric], w) for l, w in zip(launches, weight) if l.get(metric) is not None]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else None


def _stall_shares(launches: list[dict], weight: list[float]) -> list[list]:
    """The `TOP_STALLS` largest stall reasons of `launches` as [reason, percent of all stall
    cycles], largest first: each reason's cycles per issued instruction averaged over the
    launches (weighted by time), as a share of their sum. Empty without stall metrics."""
    means = ((reason, _weighted_mean(launches, weight, m)) for reason, m in STALLS.items())
    cycles = {reason: mean for reason, mean in means if mean is not None}
    total = sum(cycles.values())
    if total <= 0:
        return []
    ranked = sorted(cycles.items(), key=lambda p: -p[1])[:TOP_STALLS]
    return [[reason, 100.0 * c / total] for reason, c in ranked if c > 0]
