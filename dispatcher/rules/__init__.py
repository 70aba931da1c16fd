"""The pure rules: immutable values with decision functions that take the clock as an argument and do no I/O.

Retry (``retry``), the breaker (``breaker``), per-endpoint limits (``limits``), health (``health``), the
rollout bucket (``rollout``), the day partitions (``partitions``), the replay budget (``replay_budget``),
backoff (``backoff``) and the attempt vocabulary that transport and retry share (``attempt``).  Nothing here
imports the store, the network or gevent.
"""
