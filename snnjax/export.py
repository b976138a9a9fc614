"""``python -m snnjax.export``: the command of :mod:`snnjax.deploy.export`."""
import sys

from snnjax.deploy.export import main

if __name__ == "__main__":
    sys.exit(main())
