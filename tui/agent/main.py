"""The agent's entry: `python agent.pyz SUBCOMMAND` with the spec as one JSON line on stdin.

Subcommands: launch, attach, watch, kill, kill_pids, runs, preflight, http, stacks. psutil is
imported first and alone, so that its absence is one JSON error naming the fix, not a traceback; the
commands' modules (which import psutil) are loaded after it.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable

from .wire import AgentFailure, SpecError, emit

FIX_PYTHON = ("point host.python at the server's venv, which has psutil and pynvml (or install "
              "them into that Python: pip install psutil nvidia-ml-py)")


def commands() -> dict[str, Callable[[dict], int]]:
    from .attach import cmd_attach
    from .http_client import cmd_http
    from .kill import cmd_kill, cmd_kill_pids
    from .launch import cmd_launch
    from .preflight import cmd_preflight
    from .runs import cmd_runs
    from .stacks import cmd_stacks
    from .watch import cmd_watch

    return {"http": cmd_http, "launch": cmd_launch, "watch": cmd_watch, "kill": cmd_kill,
            "runs": cmd_runs, "preflight": cmd_preflight, "kill_pids": cmd_kill_pids,
            "stacks": cmd_stacks, "attach": cmd_attach}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        import psutil  # noqa: F401  (only to say so when it is missing)
    except ImportError as exc:
        emit("error", kind="missing_module", module="psutil",
             message=f"{exc} (interpreter {sys.executable}): {FIX_PYTHON}", fix=FIX_PYTHON)
        return 3
    sub = args[0] if args else ""
    command = commands().get(sub)
    if command is None:
        emit("error", kind="bad_spec", message=f"unknown subcommand {sub!r}")
        return 2
    try:
        spec = json.loads(sys.stdin.buffer.readline())
        if not isinstance(spec, dict):
            raise SpecError("the spec must be a JSON object")
        return command(spec)
    except (SpecError, ValueError) as exc:
        emit("error", kind="bad_spec", message=str(exc))
        return 2
    except AgentFailure as exc:
        emit("error", kind=exc.kind, message=str(exc))
        return 1
    except Exception as exc:
        emit("error", kind="internal", message=f"{type(exc).__name__}: {exc}",
             traceback=traceback.format_exc())
        return 1
