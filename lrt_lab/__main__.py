"""`python -m lrt_lab ...` is the `lrt-lab` command."""

import sys

from lrt_lab.commands.cli import main

sys.exit(main())
