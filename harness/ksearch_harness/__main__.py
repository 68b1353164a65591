"""Command line: ``python -m ksearch_harness {evaluate,build,probe,check-task,yardstick,profile}
--result-fd N``: the request arrives on stdin; the one result line goes to fd N (see
supervisor.py). ``python -m ksearch_harness serve --result-fd N``: the persistent judge, one
request per line on stdin and one result line each on fd N (supervisor.serve_loop)."""

from __future__ import annotations

import argparse
import sys

from .protocol import OPS


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
