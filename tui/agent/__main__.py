"""`python -m tui.agent SUBCOMMAND` (and the archive's entry): see main.py."""

import sys

from .main import main

sys.exit(main())
