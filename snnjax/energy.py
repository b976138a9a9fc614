"""``python -m snnjax.energy``: the command of :mod:`snnjax.deploy.energy`."""
import sys

from snnjax.deploy.energy import main

if __name__ == "__main__":
    sys.exit(main())
