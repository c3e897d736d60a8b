"""``python -m daemon`` = the ``coeffd`` command."""

import sys

from daemon.cli import main

sys.exit(main())
