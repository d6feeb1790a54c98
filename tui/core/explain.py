"""Post-mortem of a saved server log: how it ended, how far it got, and why.

The same pipeline as a live launch (decode, noise, phases, root cause) without processes: no
death is reported, so the cause is the first real exception. `specconsole explain` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, NoiseRule, builtin_rules
from tui.core.phases import Phase, detect_phase
from tui.core.rootcause import RootCause, RootCauseTracker

Outcome = Literal["ready", "crashed", "hung", "unknown"]

# vLLM's hang heartbeat, repeated every 60 s while a collective waits for a stuck process.
_HEARTBEAT = "No available shared memory broadcast block found"


@dataclass(frozen=True, slots=True)
class Explanation:
    """`root_cause` is None for a ready server (an error it survived is no cause of anything)."""

    outcome: Outcome
    last_phase: Phase | None
    root_cause: RootCause | None
    symptoms: tuple[str, ...]
    hidden: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        """Stable schema: outcome, last_phase (phase name, lower case), root_cause {line,
        process} or null, symptoms [str], hidden {rule id: count}."""
        cause = self.root_cause
        return {
            "outcome": self.outcome,
            "last_phase": self.last_phase.name.lower() if self.last_phase else None,
            "root_cause": {"line": cause.line, "process": cause.process} if cause else None,
            "symptoms": list(self.symptoms),
            "hidden": dict(sorted(self.hidden.items())),
        }


def explain(lines: Iterable[str], engine: str = "vllm",
            extra_rules: Iterable[NoiseRule] = ()) -> Explanation:
    """Read a whole log. Offsets are byte offsets, as in the run's server.log."""
    noise = NoiseFilter([*extra_rules, *builtin_rules(engine)])
    tracker = RootCauseTracker(noise, engine)
    last_phase: Phase | None = None
    ready_at = progress_at = heartbeat_at = -1
    offset = 0
    for raw in lines:
        line = parse_line(raw, offset)
        offset += len(raw.encode("utf-8", "replace")) + (0 if raw.endswith("\n") else 1)
        rule = noise.classify(line)
        tracker.feed(line)
        if rule is not None:
            continue
        hit = detect_phase(line, engine)
        if hit is not None:
            progress_at = line.offset
            if last_phase is None or hit.phase > last_phase:
                last_phase = hit.phase
            if hit.phase >= Phase.READY_LOG:
                ready_at = line.offset
        elif _HEARTBEAT in line.message:
            heartbeat_at = line.offset
    outcome = _outcome(tracker, ready_at, progress_at, heartbeat_at)
    cause = tracker.cause() if outcome != "ready" else None
    return Explanation(outcome, last_phase, cause, tracker.symptoms, dict(noise.hidden))


def _outcome(tracker: RootCauseTracker, ready_at: int, progress_at: int,
             heartbeat_at: int) -> Outcome:
    """Crashed: a symptom after the last ready line, or a real exception after which nothing
    progressed. Hung: the heartbeat after the last ready line. Otherwise ready if it got there."""
    exception_at = tracker.last_exception_offset
    if tracker.last_symptom_offset > ready_at or (exception_at > ready_at
                                                  and exception_at > progress_at):
        return "crashed"
    if heartbeat_at > ready_at:
        return "hung"
    return "ready" if ready_at >= 0 else "unknown"
