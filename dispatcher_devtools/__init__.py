"""Developer tools for ``dispatcher``: the mock receiver, the demo, and the kit
that tests and benchmarks share.  Not part of the wheel (setup.cfg only packages
``dispatcher``); it is importable from a source checkout.

This package imports nothing: ``python -m dispatcher_devtools.receiver`` loads
it before the receiver can monkey-patch.
"""
