"""Benchmarks for the dispatcher (issue 5): ``python -m benchmarks [--scenario NAME] [--json]``.

Every scenario runs on this machine only (loopback receiver, local Postgres),
in its own throw-away database ``bench_<scenario>_<pid>``, and returns one
JSON-able dict.  ``docs/benchmarks.md`` explains the scenarios and the latest
figures; ``docs/capacity.md`` turns them into a capacity model.
"""
