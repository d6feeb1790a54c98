"""Python stacks of the run's processes, as py-spy dumps them, read for a person: per process
its threads and frames, the engine's own frames marked, and where each process is stuck.

`py-spy dump` prints, per thread, `Thread 123 (idle): "MainThread"` and then its frames
innermost first, each `    function (path:line)`. The innermost frame of the engine's own code
(vLLM, SGLang, or the simulated engine) is where the engine itself waits: a collective, a
weight load, a lock; the frames below it are torch's and Python's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tui.core.logline import strip_escapes

_THREAD_RE = re.compile(r'Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?:: "(.*)")?$')
_FRAME_RE = re.compile(r"^\s+(\S.*?) \((.+?)(?::(\d+))?\)$")
# The engine's own code: where a frame says what the server itself was doing.
_ENGINE_RE = re.compile(r"(?:^|/)(?:vllm|vllm_ascend|sglang|tui/sim)/")
_ENGINE_SHORT_RE = re.compile(r"(?:.*/)?((?:vllm|vllm_ascend|sglang|tui/sim)/.+)$")


@dataclass(frozen=True, slots=True)
class Frame:
    function: str
    path: str
    line: int | None
    engine: bool

    def where(self) -> str:
        m = _ENGINE_SHORT_RE.match(self.path)
        path = m.group(1) if m else self.path
        return f"{self.function} ({path}{f':{self.line}' if self.line is not None else ''})"


@dataclass(frozen=True, slots=True)
class Thread:
    header: str  # `Thread 123 (idle): "MainThread"`
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True, slots=True)
class ProcessStacks:
    """One process: its threads, or why there are none (`error`)."""

    pid: int
    name: str
    state: str | None
    threads: tuple[Thread, ...]
    error: str | None = None

    def stuck_in(self) -> Frame | None:
        """The innermost engine frame of the first thread that has one (the main thread first:
        py-spy lists it first), else the innermost frame."""
        for thread in self.threads:
            for frame in thread.frames:
                if frame.engine:
                    return frame
        return next((t.frames[0] for t in self.threads if t.frames), None)

    def summary(self) -> str:
        state = f", {self.state}" if self.state else ""
        head = f"{self.name} (pid {self.pid}{state})"
        if self.error is not None:
            return f"{head}: no stack — {self.error}"
        frame = self.stuck_in()
        return f"{head}: in {frame.where()}" if frame else f"{head}: no Python frames"


def parse_dump(text: str) -> tuple[Thread, ...]:
    """The threads of one `py-spy dump`; lines that are neither a thread nor a frame (the
    process and Python version header, --native addresses without a source) are skipped."""
    threads: list[Thread] = []
    header: str | None = None
    frames: list[Frame] = []
    for raw in text.splitlines():
        line = strip_escapes(raw)
        stripped = line.strip()
        if _THREAD_RE.match(stripped):
            if header is not None:
                threads.append(Thread(header, tuple(frames)))
            header, frames = stripped, []
            continue
        m = _FRAME_RE.match(line)
        if header is not None and m is not None:
            path = m.group(2)
            frames.append(Frame(m.group(1), path, int(m.group(3)) if m.group(3) else None,
                                _ENGINE_RE.search(path) is not None))
    if header is not None:
        threads.append(Thread(header, tuple(frames)))
    return tuple(threads)


def process_stacks(pid: int, name: str, state: str | None, text: str | None,
                   error: str | None) -> ProcessStacks:
    if text is None:
        return ProcessStacks(pid, name, state, (), strip_escapes(error or "no dump"))
    return ProcessStacks(pid, name, state, parse_dump(text))


def stack_lines(stacks: ProcessStacks) -> list[tuple[str, str]]:
    """One process for reading: (kind, text) pairs, kind one of "header", "thread", "frame",
    "engine" (the engine's own code), "stuck" (its innermost engine frame), "error"."""
    state = f" · {stacks.state}" if stacks.state else ""
    out = [("header", f"{stacks.name} (pid {stacks.pid}){state}")]
    if stacks.error is not None:
        return [*out, ("error", f"  no stack: {stacks.error}")]
    stuck = stacks.stuck_in()
    for thread in stacks.threads:
        out.append(("thread", f"  {thread.header}"))
        for frame in thread.frames:
            kind = "stuck" if frame is stuck else "engine" if frame.engine else "frame"
            mark = "▶ " if kind == "stuck" else "  "
            out.append((kind, f"  {mark}{frame.where()}"))
    return out
