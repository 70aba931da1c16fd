"""``python -m dispatcher.cli``: the same command line as ``bin/dispatcher``."""

import sys

from dispatcher.cli.main import main

sys.exit(main())
