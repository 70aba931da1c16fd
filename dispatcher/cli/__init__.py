"""The command line: ``dispatcher`` and its verbs (``main``), the endpoint and token verbs (``manage``), rollout,
the phase gates and ``status``/``check``."""
