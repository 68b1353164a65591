"""ksearch evaluation harness: builds, checks and times one candidate kernel per process.

Run as ``python -m ksearch_harness <op> --result-fd N`` with the request on stdin; see
``docs/ARCHITECTURE.md`` (protocol v1) and ``harness/README.md``.
"""

PROTOCOL_VERSION = 1
__version__ = "0.1.0"
