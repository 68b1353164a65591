"""Command line: ``python -m ksearch_harness {evaluate,build,probe,check-task,yardstick,profile}
--result-fd N``: the request arrives on stdin; the one result line goes to fd N (see
supervisor.py). ``python -m ksearch_harness serve --result-fd N``: the persistent judge, one
request per line on stdin and one result line each on fd N (supervisor.serve_loop)."""

from __future__ import annotations

import argparse
import os
import sys

# Before anything imports numpy: the judge's BLAS runs on one thread. A pool of BLAS workers
# keeps spinning for a while after each call (OpenBLAS: about a tenth of a second), on the cores
# a cpu candidate's threads are timed on next, and a pool that did sleep wakes late, so the
# reference (the cpu anchor) read at two levels and bound OpenMP candidates had heavy tails
# (docs/results/scores). One thread is slower on large products, but the same every time.
for _name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"

from .protocol import OPS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ksearch_harness",
                                     description="ksearch evaluation harness (protocol v1)")
    parser.add_argument("op", choices=(*OPS, "serve"))
    parser.add_argument("--result-fd", type=int, required=True,
                        help="file descriptor that receives the single JSON result line")
    args = parser.parse_args(argv)
    from .supervisor import serve, serve_loop
    if args.op == "serve":
        return serve_loop(args.result_fd)
    return serve(args.op, args.result_fd)


if __name__ == "__main__":
    sys.exit(main())
