"""``python -m probeselect`` is the console script (so ``accelerate launch -m probeselect`` works)."""

import sys

from .cli import main

sys.exit(main())
