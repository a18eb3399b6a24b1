"""``python -m minfer.serve --model smollm2-135m``: see ``minfer.serve.cli``."""

import sys

from minfer.serve.cli import main

sys.exit(main())
