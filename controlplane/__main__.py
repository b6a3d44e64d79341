"""`python -m controlplane` runs the command line."""

import sys

from controlplane.cli.main import main

sys.exit(main())
