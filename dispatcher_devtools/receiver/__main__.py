"""``python -m dispatcher_devtools.receiver``: patch first, then serve."""

import dispatcher_devtools.green  # noqa: F401  -- first: patches before anything imports socket or ssl
from dispatcher_devtools.receiver.cli import main

raise SystemExit(main())
