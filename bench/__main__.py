"""`python -m bench`: hands the command line to bench.cli."""

import sys

from bench.cli import main

sys.exit(main())
