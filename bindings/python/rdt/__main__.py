"""``python -m rdt``: the ``rdt`` command (doctor, info, bench)."""

import sys

from ._cli._main import main

sys.exit(main())
