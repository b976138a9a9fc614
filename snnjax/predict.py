"""``python -m snnjax.predict``: the command of :mod:`snnjax.deploy.predict`."""
import sys

from snnjax.deploy.predict import main

if __name__ == "__main__":
    sys.exit(main())
