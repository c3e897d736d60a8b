"""``python -m coeffd.daemon`` = the ``coeffd`` command."""

import sys

from coeffd.daemon.cli import main

if __name__ == "__main__":  # guarded: doctest collection imports this module
    sys.exit(main())
