"""``python -m zoi.bench [args]`` is ``zoi bench [args]``."""

import sys

from zoi.bench.cli import main

sys.exit(main())
