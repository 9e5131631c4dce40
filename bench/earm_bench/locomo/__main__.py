"""``python -m earm_bench.locomo --data DIR …``: the replay without the ``earm`` command."""

import sys

from earm_bench.locomo.cli import main

sys.exit(main())
