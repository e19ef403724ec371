"""``python -m rdt``: the ``rdt`` command (doctor, info, bench)."""

import sys

from ._cli import main

sys.exit(main())
