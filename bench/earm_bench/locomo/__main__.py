"""``python -m service.bench.locomo --data DIR …``: the replay without the ``earm`` command."""

import sys

from service.bench.locomo.cli import main

sys.exit(main())
