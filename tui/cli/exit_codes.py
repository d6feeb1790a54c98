"""The CLI's exit codes (documented in the README), shared by the single- and multi-host paths."""

import signal

EXIT_READY = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_DEAD = 3
EXIT_TIMEOUT = 4
EXIT_STALLED = 5
EXIT_PREFLIGHT = 6
EXIT_HANGUP = 128 + signal.SIGHUP  # the headless demo, its terminal gone (as a shell says it)
