"""``python -m otzoo``: the ``otzoo`` command line."""
import sys

from otzoo.cli import main

sys.exit(main())
