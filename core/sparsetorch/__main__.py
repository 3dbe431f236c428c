"""``python -m sparsetorch``: same as the ``sparsetorch`` console script."""

import sys

from sparsetorch.cli import main

if __name__ == "__main__":
    sys.exit(main())
