"""``python -m snnjax.launch``: the command of :mod:`snnjax.runtime.launch`."""
import sys

from snnjax.runtime.launch import main

if __name__ == "__main__":
    sys.exit(main())
