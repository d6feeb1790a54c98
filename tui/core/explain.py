"""Post-mortem of a saved server log: how it ended, how far it got, and why.

The same reader as a live launch (tui.core.diagnosis: decode, noise, phases, root cause, hang
markers) without processes: no death is reported, so the cause is the first real failure.
`specconsole explain` prints it; lines are decoded in chunks as the console decodes the agent's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, islice, repeat
from operator import add
from pathlib import Path
from typing import BinaryIO

from tui.core.diagnosis import Diagnosis, Explanation, Outcome
from tui.core.failures import exit_signal, hint_for
from tui.core.logchunk import ChunkReader, LineChunk
from tui.core.noise import NoiseFilter, NoiseRule, builtin_rules

__all__ = ["Explanation", "Outcome", "diagnose_file", "explain", "explain_file",
           "explanation_lines"]

_CHUNK_LINES = 4096
_BLOCK = 4 << 20  # bytes of a file read at a time: memory stays bounded whatever its size


def explain(lines: Iterable[str], engine: str = "vllm",
            extra_rules: Iterable[NoiseRule] = ()) -> Explanation:
    """Read a whole log. Offsets are byte offsets, as in the run's server.log."""
    noise = NoiseFilter([*extra_rules, *builtin_rules(engine)])
    diagnosis = Diagnosis(engine, noise)
    reader = ChunkReader(engine, noise)
    offset = 0
    it = iter(lines)
    while chunk := list(islice(it, _CHUNK_LINES)):
        pairs = []
        for raw in chunk:
            text = raw.rstrip("\r\n") if raw[-1:] in ("\n", "\r") else raw
            pairs.append((offset, text))
            offset += len(raw.encode("utf-8", "replace")) + (0 if raw.endswith("\n") else 1)
        read = reader.read(pairs, diagnosis.tracker.in_traceback())
        diagnosis.feed(read.lines, read.rules)
    return diagnosis.verdict()


def explain_file(path: str | Path, engine: str = "vllm", extra_rules: Iterable[NoiseRule] = (),
                 on_progress: Callable[[int, int], None] | None = None,
                 survived: frozenset[str] = frozenset()) -> Explanation:
    """`explain` for a file of any size, read a block at a time (memory stays bounded: lines
    stay text in their block, addressed by byte offset); `on_progress(done, total)` after each
    block; `survived`: shapes of errors a good launch of the profile logged (never the cause
    while another is known). OSError as opening the file raises it."""
    return diagnose_file(path, engine, extra_rules, on_progress, survived).verdict()


def diagnose_file(path: str | Path, engine: str = "vllm", extra_rules: Iterable[NoiseRule] = (),
                  on_progress: Callable[[int, int], None] | None = None,
                  survived: frozenset[str] = frozenset()) -> Diagnosis:
    """The whole file read into a Diagnosis (explain_file's reading; the corpus's training
    script asks it for the candidates and their verdict under other weights)."""
    noise = NoiseFilter([*extra_rules, *builtin_rules(engine)])
    diagnosis = Diagnosis(engine, noise)
    diagnosis.tracker.survived = survived
    reader = ChunkReader(engine, noise)
    with open(path, "rb") as f:
        total = f.seek(0, 2)
        f.seek(0)
        for offsets, raws, done in _blocks(f):
            for at in range(0, len(raws), _CHUNK_LINES):
                chunk = LineChunk(offsets[at:at + _CHUNK_LINES], raws[at:at + _CHUNK_LINES])
                read = reader.read_chunk(chunk, diagnosis.tracker.in_traceback())
                diagnosis.feed(read.lines, read.rules)
            if on_progress is not None:
                on_progress(done, total)
    return diagnosis


def _blocks(f: BinaryIO) -> Iterator[tuple[list[int], list[str], int]]:
    """(byte offsets, lines, bytes read so far) a block at a time, each block cut after its
    last newline (a last line without one ends the file). Decoding never adds or removes a
    newline, so bytes and text split alike; an ASCII block's offsets come from the text."""
    start, carry = 0, b""
    while True:
        data = f.read(_BLOCK)
        block = carry + data
        if not block:
            return
        cut = block.rfind(b"\n") + 1 if data else len(block)
        if cut == 0:  # one line longer than a block: read on
            carry = block
            continue
        block, carry = block[:cut], block[cut:]
        texts = block.decode("utf-8", "replace").split("\n")
        pieces = texts if block.isascii() else block.split(b"\n")
        if block.endswith(b"\n"):
            texts.pop()
            if pieces is not texts:
                pieces.pop()
        lengths = map(len, pieces)
        offsets = list(accumulate(map(add, lengths, repeat(1)), initial=start))
        offsets.pop()  # the end of the last line
        yield offsets, texts, start + cut
        start += cut


def explanation_lines(ex: Explanation, indent: str = "") -> list[str]:
    """`explain` for a human: the outcome and the phase it ended in, the process, the cause
    line (or, when the log lost it, where the traceback was), the class and its hint, the
    symptoms; a section per docker-compose service when there are several."""
    phase = f" (in {ex.last_phase})" if ex.last_phase is not None else ""
    out = [f"outcome:       {ex.outcome}{phase if ex.outcome != 'ready' else ''}",
           f"last phase:    {ex.last_phase or 'none'}"]
    cause = ex.root_cause
    if cause is not None:
        label = "hang marker" if ex.outcome == "hung" else (
            "root cause" if ex.outcome == "crashed" else "last error")
        if cause.process:
            out.append(f"process:       {cause.process}")
        if cause.signal is not None:  # ended by a signal, no error of its own to name
            out.append(f"{label + ':':<15}{cause.line}")
        elif cause.missing:
            out.append(f"{label + ':':<15}(not in the log: the traceback was cut before its "
                       "exception line)")
            if cause.deepest_frame:
                out.append(f"deepest frame: {cause.deepest_frame}")
        else:
            out.append(f"{label + ':':<15}{cause.line}")
            if cause.deepest_frame:  # faulthandler's stack under a fatal error: where
                out.append(f"where:         {cause.deepest_frame}")
            if ex.runner_up is not None and cause.reasons:
                out.append(f"{'':15}(chosen: {'; '.join(cause.reasons)})")
        if cause.kind is not None:
            out.append(f"class:         {cause.kind.label}")
            out.append(f"hint:          {hint_for(cause.kind, cause.line)}")
    second = ex.runner_up
    if second is not None and cause is not None and not cause.missing:
        out.append(f"runner-up:     {second.line}")
        if second.reasons:
            out.append(f"{'':15}(considered: {'; '.join(second.reasons)})")
    if ex.requests_failed:
        serving = " while the server went on serving" if ex.outcome == "ready" else ""
        out.append(f"requests:      {ex.requests_failed} failed{serving}; the first: "
                   f"{ex.first_failed_request}")
    out += [f"symptom:       {symptom}" for symptom in ex.symptoms]
    stated = ([cause.line] if cause is not None and not cause.missing else [])
    said = next(filter(None, map(exit_signal, stated + list(ex.symptoms))), None)
    if said is not None:
        out.append(f"exit status:   {said}")
    for name, service in (ex.services or {}).items():
        out.append(f"service {name}:")
        out += explanation_lines(Explanation(service.outcome, service.last_phase,
                                             service.root_cause, (), {}), "  ")
    return [indent + line for line in out]
