"""``python -m cadence``: the same as the ``cadence`` command."""

import sys

from cadence.cli import main

sys.exit(main())
