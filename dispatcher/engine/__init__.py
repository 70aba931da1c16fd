"""The delivery engine that runs in worker processes: the claim loop and lanes (``worker``), one attempt
(``delivery``), the region leader's rounds (``upkeep``) and owner notices (``notifier``).  It holds no SQL."""
