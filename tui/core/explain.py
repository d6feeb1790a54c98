"""Post-mortem of a saved server log: how it ended, how far it got, and why.

The same reader as a live launch (tui.core.diagnosis: decode, noise, phases, root cause, hang
markers) without processes: no death is reported, so the cause is the first real failure.
`specconsole explain` prints it; lines are decoded in chunks as the console decodes the agent's.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from tui.core.diagnosis import Diagnosis, Explanation, Outcome
from tui.core.failures import hint_for
from tui.core.logline import parse_lines
from tui.core.noise import NoiseFilter, NoiseRule, builtin_rules

__all__ = ["Explanation", "Outcome", "explain", "explanation_lines"]

_CHUNK_LINES = 4096


def explain(lines: Iterable[str], engine: str = "vllm",
            extra_rules: Iterable[NoiseRule] = ()) -> Explanation:
    """Read a whole log. Offsets are byte offsets, as in the run's server.log."""
    noise = NoiseFilter([*extra_rules, *builtin_rules(engine)])
    diagnosis = Diagnosis(engine, noise)
    offset = 0
    it = iter(lines)
    while chunk := list(islice(it, _CHUNK_LINES)):
        pairs = []
        for raw in chunk:
            text = raw.rstrip("\r\n") if raw[-1:] in ("\n", "\r") else raw
            pairs.append((offset, text))
            offset += len(raw.encode("utf-8", "replace")) + (0 if raw.endswith("\n") else 1)
        parsed = parse_lines(pairs)
        diagnosis.feed(parsed, noise.classify_all(parsed))
    return diagnosis.verdict()


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
        if cause.missing:
            out.append(f"{label + ':':<15}(not in the log: the traceback was cut before its "
                       "exception line)")
            if cause.deepest_frame:
                out.append(f"deepest frame: {cause.deepest_frame}")
        else:
            out.append(f"{label + ':':<15}{cause.line}")
        if cause.kind is not None:
            out.append(f"class:         {cause.kind.label}")
            out.append(f"hint:          {hint_for(cause.kind, cause.line)}")
    out += [f"symptom:       {symptom}" for symptom in ex.symptoms]
    for name, service in (ex.services or {}).items():
        out.append(f"service {name}:")
        out += explanation_lines(Explanation(service.outcome, service.last_phase,
                                             service.root_cause, (), {}), "  ")
    return [indent + line for line in out]
