"""The log's compact form: what vLLM and SGLang put before a message, in a few columns.

`(Worker_TP1 pid=19506) ERROR 12-06 02:37:21 [multiproc_executor.py:772] ` costs ~70 columns
of every line. Compact, the time is a narrow gutter, the process a short tag in its own colour,
and the level a mark: `02:37:21 TP1  ✖ SyntaxError: …`. The raw view shows the line as it was
written.
"""

from __future__ import annotations

import re
import zlib

from rich.text import Text

from tui.core.logline import LogLine

TIME_W = 8
TAG_W = 6
GUTTER = TIME_W + 1 + TAG_W + 1 + 2  # time, tag, the level mark and a space
_TIME_RE = re.compile(r"\b(\d\d:\d\d:\d\d)\b")
# Words of the process names that carry no information once the tag is short.
_TAG_WORDS = re.compile(r"VllmWorker|Worker|scheduler|rank=|pid=\d+|[_ ,=]")
_TAG_NAMES = {"APIServer": "API", "EngineCore": "Core", "SGLangServer": "API",
              "RayWorkerWrapper": "Ray", "VllmWorkerProcess": "Wrk", "detokenizer": "Detok"}
_MARKS = {"ERROR": ("✖", "bold red"), "CRITICAL": ("✖", "bold red"),
          "WARNING": ("▲", "yellow"), "INFO": ("·", "dim"), "DEBUG": ("·", "dim")}
# Colours a tag may take (by a hash of the process name): readable on dark and light themes.
_TAG_COLOURS = ("cyan", "magenta", "green", "blue", "bright_cyan", "bright_magenta",
                "bright_green", "bright_blue", "dark_orange", "orchid")


def process_tag(proc: str | None) -> str:
    """`Worker_TP3` → `TP3`, `EngineCore_DP0` → `Core0`, `APIServer` → `API`,
    `scheduler_DP0_TP3` → `DP0TP3`, `VllmWorker rank=2` → `W2`; at most TAG_W characters."""
    if not proc:
        return ""
    for name, tag in _TAG_NAMES.items():
        if proc.startswith(name):
            return (tag + proc[len(name):].lstrip("_ ").removeprefix("DP"))[:TAG_W]
    short = _TAG_WORDS.sub("", proc)
    return (f"W{short}" if short.isdigit() else short or proc)[:TAG_W]


def tag_style(proc: str) -> str:
    return _TAG_COLOURS[zlib.crc32(proc.encode()) % len(_TAG_COLOURS)]


def gutter(line: LogLine) -> Text:
    """The time, the process tag and the level mark: GUTTER columns, whatever the line."""
    head = line.plain[:len(line.plain) - len(line.message)] \
        if line.message and line.plain.endswith(line.message) else line.plain
    stamp = _TIME_RE.search(head)
    out = Text(no_wrap=True, end="")
    out.append(f"{stamp.group(1) if stamp else '':<{TIME_W}} ", style="dim")
    tag = process_tag(line.proc)
    out.append(f"{tag:<{TAG_W}} ", style=tag_style(line.proc) if line.proc else "")
    mark, style = _MARKS.get(line.level or "", (" ", ""))
    out.append(f"{mark} ", style=style)
    return out


def compact_message(line: LogLine) -> str:
    """What the line says after the gutter: the message, or the whole line when it has no
    structure to fold into the gutter (a bar, a raw traceback line)."""
    if line.proc is None and line.level is None:
        return line.plain
    return line.message
