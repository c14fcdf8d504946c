"""``python -m flightfeed.server ...`` is the ``flightfeed`` command."""

import sys

from flightfeed.server.cli import main

sys.exit(main())
