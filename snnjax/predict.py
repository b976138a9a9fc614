"""``python -m snnjax.predict``: the command of :mod:`snnjax.deploy.prediction`."""
import sys

from snnjax.deploy.prediction import main

if __name__ == "__main__":
    sys.exit(main())
