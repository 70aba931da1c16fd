"""Process entry points and start-up: the patch-first entry module, the supervisor, the worker and API mains,
exit codes, logging set-up, the embedded server and the bounded database waits.

Deliberately empty: a green entry module's first import is ``dispatcher.runtime.entry``, and nothing may load
before the patch but what the package ``__init__`` files load.
"""
