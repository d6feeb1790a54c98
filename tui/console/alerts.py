"""Alerts that reach the user outside the console's panes: the tmux window name, or the
terminal's title when not inside tmux (the bell is the app's own)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Mapping

from tui.core.logline import strip_escapes


def window_name_command(text: str, env: Mapping[str, str]) -> list[str] | None:
    """`tmux rename-window` for the pane this console runs in, or None outside tmux."""
    if not env.get("TMUX"):
        return None
    target = env.get("TMUX_PANE")
    return ["tmux", "rename-window", *(["-t", target] if target else []), text]


def display_command(text: str, env: Mapping[str, str]) -> list[str] | None:
    """`tmux display-message` in this console's client (seen from any window), or None."""
    if not env.get("TMUX"):
        return None
    target = env.get("TMUX_PANE")
    return ["tmux", "display-message", *(["-t", target] if target else []),
            strip_escapes(text).replace("#", "##")]


def restore_command(env: Mapping[str, str]) -> list[str] | None:
    """Give the window its automatic name back when the console exits."""
    if not env.get("TMUX"):
        return None
    target = env.get("TMUX_PANE")
    return ["tmux", "set-window-option", *(["-t", target] if target else []),
            "automatic-rename", "on"]


def title_sequence(text: str) -> str:
    """OSC 2: the terminal's title; the text is stripped of escapes and control characters."""
    return f"\x1b]2;{strip_escapes(text)}\x07"


async def run_quietly(argv: list[str], env: Mapping[str, str]) -> None:
    """Run a short local command, never raising and never waiting more than 2 s."""
    with contextlib.suppress(OSError, asyncio.TimeoutError):
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except asyncio.TimeoutError:
            proc.kill()
            raise


async def announce(text: str, env: Mapping[str, str], message: str | None = None) -> None:
    """Name the tmux window (or title the terminal) after the run's state, and flash
    `message` in tmux's status line."""
    argv = window_name_command(text, env)
    if argv is not None:
        await run_quietly(argv, env)
        shown = display_command(message, env) if message else None
        if shown is not None:
            await run_quietly(shown, env)
    else:
        stream = sys.__stderr__
        if stream is not None and stream.isatty():
            stream.write(title_sequence(text))
            stream.flush()
