"""The dev tools' one monkey-patch preamble: import this module first.

``import dispatcher_devtools.green`` as the very first import of a green dev
tool (the mock receiver, ``tests/support/green.py``, ``benchmarks/bare_loop.py``)
patches the interpreter the way the production workers are patched: gevent
first, before anything imports socket, ssl, threading or select, then
psycogreen so psycopg2 waits cooperatively.  The product's own processes use
their own entry modules; this one is only for tools outside the wheel.

Importing it anywhere else (a library, pytest) would patch the importer, so
library code must never import it.
"""

from dispatcher.runtime.entry import patch_or_exit

patch_or_exit("dispatcher dev tool")  # the product's own preamble: written once
