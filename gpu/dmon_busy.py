"""The driver's view of how busy the device was during a run: the mean of `nvidia-smi dmon`'s
`sm` column (per sample, the share of the sampling period in which at least one kernel ran on
the device, whatever process launched it) over the samples taken between two wall-clock times.
An independent check of `ksearch show`'s device busy fraction, which adds up the harness phases
that contain device work and so bounds that work from above (docs/cli.md).

    python3 gpu/dmon_busy.py dmon.txt START END     (START, END: HH:MM:SS, as `date +%T`)

Reads `nvidia-smi dmon -i GPU -s u -o T -d 1` output; prints one line, or says why it cannot."""

from __future__ import annotations

import statistics
import sys


def seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return 3600 * h + 60 * m + s


def samples(lines: list[str], start: int, end: int) -> list[int]:
    """The `sm` values of the dmon rows stamped within [start, end] (seconds of the day; a
    span past midnight wraps). Rows of one GPU only (dmon -i): ValueError if there are
    several."""
    wraps = end < start
    out = []
    gpus = set()
    for line in lines:
        parts = line.split()
        if len(parts) < 3 or line.lstrip().startswith("#") or not parts[2].isdigit():
            continue
        try:
            t = seconds(parts[0])
        except ValueError:
            continue
        inside = (t >= start or t <= end) if wraps else start <= t <= end
        if inside:
            gpus.add(parts[1])
            out.append(int(parts[2]))
    if len(gpus) > 1:
        raise ValueError(f"samples of {len(gpus)} GPUs ({', '.join(sorted(gpus))}): "
                         "sample one (nvidia-smi dmon -i)")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        try:
            got = samples(f.readlines(), seconds(argv[2]), seconds(argv[3]))
        except ValueError as e:
            print(f"driver-sampled device busy: {e}")
            return 1
    if not got:
        print(f"driver-sampled device busy: no dmon samples between {argv[2]} and {argv[3]}")
        return 1
    print(f"driver-sampled device busy: {statistics.fmean(got):.1f}% (mean sm% of {len(got)} "
          f"one-second samples, {argv[2]}-{argv[3]}; any kernel running counts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
