"""specconsole's agent: runs on the GPU host, stdlib + psutil + pynvml and nothing else of tui.

Shipped there as one archive built from this package (tui.remote.agent_archive) and run by the
host's Python; streams JSON lines on stdout. main.py lists the subcommands.
"""
