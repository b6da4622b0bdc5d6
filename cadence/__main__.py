"""``python -m cadence``: the same as the ``cadence`` command."""

import sys

from cadence.task.cli import main

sys.exit(main())
