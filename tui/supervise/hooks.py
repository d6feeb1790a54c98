"""Profile hooks: a local command per alert (on_ready, on_dead, on_stalled, and on_ending: a
Slurm job nearing its time limit), so a user can post to a chat or ntfy with curl. The event
reaches the command in SPECCONSOLE_* environment variables (never interpolated into the command
line); a hook that hangs is killed after its timeout, and nothing waits for it but its own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping

from tui.core.logline import strip_escapes


def hook_env(base: Mapping[str, str], event: str, fields: Mapping[str, object]) -> dict[str, str]:
    """The environment of a hook: this process's, plus SPECCONSOLE_EVENT and one variable per
    field (`cause` → SPECCONSOLE_CAUSE), remote text stripped of escapes."""
    env = dict(base)
    env["SPECCONSOLE_EVENT"] = event
    for name, value in fields.items():
        if value is not None:
            env[f"SPECCONSOLE_{name.upper()}"] = strip_escapes(str(value))
    return env


async def run_hook(command: str, env: Mapping[str, str], timeout: float) -> str | None:
    """Run `command` with the shell (it is the user's own local command); None when it
    succeeded, else why not, in a few words."""
    try:
        proc = await asyncio.create_subprocess_shell(
            command, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
    except OSError as exc:
        return f"could not start: {exc.strerror}"
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        return f"timed out after {timeout:g}s and was killed"
    if proc.returncode:
        tail = strip_escapes(err.decode("utf-8", "replace").strip().splitlines()[-1]) \
            if err.strip() else ""
        return f"exited {proc.returncode}" + (f": {tail}" if tail else "")
    return None
