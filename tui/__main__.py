"""`python -m tui` is `specconsole`."""

import sys

from tui.cli.entry import main

sys.exit(main())
