"""``python -m otzoo``: the ``otzoo`` command line."""
import sys

from otzoo.launch import main

sys.exit(main())
