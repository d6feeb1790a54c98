"""The verdict a log gives, read incrementally: how far the server got, whether it is ready,
crashed or hung, and why. One reader for the live stream (LaunchMachine) and for a saved log
(`explain`), so that both say the same thing of the same lines, however they were chunked.

Evidence, by failure class rather than by one log's words:
- ready: a READY_LOG or SERVING phase line (uvicorn's startup complete, SGLang's "fired up",
  throughput and batch lines, a request answered);
- crashed: a symptom (a process reporting another's death) after the last ready line, or an
  exception, a stated failure, or a traceback cut before its exception line, after which
  nothing progressed (tui.core.rootcause); after READY, what the launch logged before its own
  READY is the lower tier of candidates (it survived it), and one request's failure (a
  traceback through the HTTP request cycle, a 5xx answer) is no crash: the server that answered
  it goes on, and the verdict counts the failed requests;
- hung: a hang marker (tui.core.failures.HANG_MARKERS) after the last ready line with no
  serving since, unless a crash came first (a watchdog that kills its process is still the
  hang's doing);
- stopped: an orderly shutdown after the last ready line (vLLM's `[shutdown]` records of a
  SIGTERM or SIGINT, uvicorn's `Shutting down` / `Finished server process`) with no failure nor
  hang marker between the two: what follows it (leak warnings, a KeyboardInterrupt) is its
  consequence;
- several docker-compose services in one file (`svc-a  | ...`): a verdict per service, and the
  file's verdict is the first service that failed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tui.core.failures import REPEATS_TO_HANG, FailureClass, hang_marker
from tui.core.logline import LogLine
from tui.core.noise import NoiseFilter, NoiseRule
from tui.core.phases import Phase, PhaseHit, detect_phase, phase_initials
from tui.core.ranking import Ranker
from tui.core.rootcause import RootCause, RootCauseTracker

Outcome = Literal["ready", "crashed", "hung", "stopped", "unknown"]

# docker compose's `svc-1  | ` (the service name, padded, then a bar)
_SERVICE_RE = re.compile(r"([A-Za-z0-9][\w.-]*?)(?:[-_]\d+)?\s+\| ")
# Needles of the hang markers: a line that holds none is no marker (one `in` each).
# A lead of the ranking's best over the next below this (in score units: about one feature's
# weight) is too narrow to name one cause alone.
RUNNER_UP_MARGIN = 0.5
# An orderly shutdown: someone asked the server to stop (uvicorn's words, vLLM's [shutdown]
# records); each starts with one of the initials, a cheap gate for every line.
_STOP_INITIALS = frozenset("SF[")
_STOP_RE = re.compile(r"Shutting down$|Finished server process\b"
                      r"|\[shutdown\].*(?:received signal=SIG(?:TERM|INT)|shutdown triggered)")
# uvicorn's access line of a request answered with a server error (`... HTTP/1.1" 500`)
_SERVER_ERROR_RE = re.compile(r'" HTTP/1\.\d" 5\d\d\b|HTTP/1\.\d" 5\d\d\b')
_HANG_NEEDLES = ("block found", "atchdog", "Timeout(ms)", "core engine proc",
                 "placement group of specs")


@dataclass(frozen=True, slots=True)
class Explanation:
    """`root_cause` is None for a ready server (an error it survived is no cause of anything);
    for a hung one it is the hang marker's line; for `unknown`, the first error seen, if any.
    `services`: one verdict per docker-compose service, when the log interleaves several."""

    outcome: Outcome
    last_phase: Phase | None
    root_cause: RootCause | None
    symptoms: tuple[str, ...]
    hidden: Mapping[str, int]
    services: Mapping[str, Explanation] | None = None
    # the next best candidate when the ranking was close (RUNNER_UP_MARGIN) or its choice
    # only reports a failure elsewhere: a user shown two loses a second, shown the wrong one
    # loses the night
    runner_up: RootCause | None = None
    # requests that failed while the server went on serving (a 5xx answer, a request's
    # traceback): how many, and the first one's error (or its answer)
    requests_failed: int = 0
    first_failed_request: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Stable schema: outcome, last_phase (phase name, lower case), root_cause {line,
        process, missing, deepest_frame, class, hint} or null, runner_up {line, process,
        reasons} or null, failed_requests {count, first} or null, symptoms [str], hidden {rule
        id: count}, services {name: {outcome, last_phase, root_cause}} or null."""
        out = self._verdict_json()
        out["runner_up"] = None if self.runner_up is None else {
            "line": self.runner_up.line, "process": self.runner_up.process,
            "reasons": list(self.runner_up.reasons)}
        out["failed_requests"] = None if not self.requests_failed else {
            "count": self.requests_failed, "first": self.first_failed_request}
        out["symptoms"] = list(self.symptoms)
        out["hidden"] = dict(sorted(self.hidden.items()))
        out["services"] = None if self.services is None else {
            name: ex._verdict_json() for name, ex in self.services.items()}
        return out

    def _verdict_json(self) -> dict[str, Any]:
        cause = self.root_cause
        return {
            "outcome": self.outcome,
            "last_phase": self.last_phase.name.lower() if self.last_phase else None,
            "root_cause": None if cause is None else {
                "line": cause.line, "process": cause.process, "missing": cause.missing,
                "deepest_frame": cause.deepest_frame,
                "class": cause.kind.id if cause.kind else None,
                "hint": cause.kind.hint if cause.kind else None},
        }


@dataclass(slots=True)
class _Hang:
    marker: FailureClass
    line: LogLine


@dataclass
class Diagnosis:
    """Feed it chunks of parsed lines with their noise verdicts; ask `verdict()` any time."""

    engine: str = "vllm"
    noise: NoiseFilter = field(default_factory=lambda: NoiseFilter([]))
    last_phase: Phase | None = None
    ready_at: int = -1  # offset of the last line that shows the server ready or serving
    progress_at: int = -1  # ... of the last phase line
    stop_at: int = -1  # ... of the first line of an orderly shutdown after the last ready one
    hang: _Hang | None = None
    answered_error_at: int = -1  # ... of the last request answered 5xx while serving
    errors_answered: int = 0
    first_error_answer: str | None = None
    by_service: bool = True  # False for a service's own diagnosis: it splits no further
    ranker: Ranker | None = None  # the candidates' ranking: the shipped one unless given
    _repeats: dict[str, int] = field(default_factory=dict)
    _services: dict[str, Diagnosis] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tracker = RootCauseTracker(self.noise, self.engine)
        self._initials = phase_initials(self.engine)

    def feed(self, lines: Sequence[LogLine], rules: Sequence[NoiseRule | None],
             ) -> list[PhaseHit | None]:
        """Classify a chunk; the phase hit of each line (None for nearly all), for the
        caller's timeline."""
        hidden = [rule is not None and rule.kind == "hide" for rule in rules]
        hits: list[PhaseHit | None] = [None] * len(lines)
        initials = self._initials
        for i, line in enumerate(lines):
            msg = line.message
            if (msg[:1] in _STOP_INITIALS and self.ready_at > self.stop_at
                    and _STOP_RE.match(msg) is not None):
                self.stop_at = line.offset  # even where a rule dims it: it is a shutdown
            if rules[i] is not None:
                continue  # noise: neither a phase nor a marker
            if msg[:1] in initials:
                hit = hits[i] = detect_phase(line, self.engine)
                if hit is not None:
                    self._on_phase(hit, line.offset)
                    continue
                if (self.ready_at >= 0 and " HTTP/1." in msg
                        and _SERVER_ERROR_RE.search(msg) is not None):
                    self._answered_error(line)
                    continue
            head = msg[:400]  # a marker says so at once; a long line is not read further
            for needle in _HANG_NEEDLES:
                if needle in head:
                    self._on_marker(line)
                    break

        # after the phases: the tracker knows READY before it reads a request's traceback
        self.tracker.feed_all(lines, hidden)
        if self.by_service:
            self._by_service(lines, rules)
        return hits

    def _answered_error(self, line: LogLine) -> None:
        """A request answered 5xx while serving: that request failed, and the API server that
        answered it is alive (the engine's death, if that was why, says so itself)."""
        self.answered_error_at = line.offset
        self.errors_answered += 1
        if self.first_error_answer is None:
            self.first_error_answer = line.message.strip()

    def _on_phase(self, hit: PhaseHit, offset: int) -> None:
        if self.last_phase is None or hit.phase > self.last_phase:
            self.last_phase = hit.phase
        self.progress_at = offset
        if hit.phase >= Phase.READY_LOG:
            self.ready_at = offset
            if self.tracker.ready_at < 0:
                self.tracker.ready_at = offset
        self._repeats.clear()

    def _on_marker(self, line: LogLine) -> None:
        marker = hang_marker(line.message)
        if marker is None:
            return
        count = self._repeats[marker.id] = self._repeats.get(marker.id, 0) + 1
        if count < REPEATS_TO_HANG.get(marker.id, 1):
            return
        if self.hang is None or self.hang.line.offset < self.ready_at:
            self.hang = _Hang(marker, line)

    def _by_service(self, lines: Sequence[LogLine], rules: Sequence[NoiseRule | None]) -> None:
        """Lines wrapped by docker compose go to their service's own diagnosis too."""
        chunks: dict[str, tuple[list[LogLine], list[NoiseRule | None]]] = {}
        # nearly every chunk has none: found in one comprehension, then read one by one
        margins = [k for k, line in enumerate(lines)
                   if line.raw[:1] != "(" and " | " in line.raw[:80]]
        for k in margins:
            line, rule = lines[k], rules[k]
            m = _SERVICE_RE.match(line.raw)
            if m is not None:
                mine = chunks.setdefault(m.group(1), ([], []))
                mine[0].append(line)
                mine[1].append(rule)
        for name, (mine, their_rules) in chunks.items():
            sub = self._services.get(name)
            if sub is None:
                sub = self._services[name] = Diagnosis(self.engine, self.noise,
                                                       by_service=False)
                sub.tracker.survived = self.tracker.survived
            sub.feed(mine, their_rules)

    # -- the verdict -------------------------------------------------------------------------

    def outcome(self) -> Outcome:
        tracker = self.tracker
        failed_at = tracker.first_failure_after(self.ready_at)
        crashed = tracker.last_symptom_offset > self.ready_at or (
            tracker.last_failure_offset() > self.ready_at
            and tracker.last_failure_offset() > max(self.progress_at, self.answered_error_at))
        hang = self.hang
        hung = hang is not None and hang.line.offset > self.ready_at
        if (self.stop_at > self.ready_at >= 0 and not (failed_at > -1 and failed_at < self.stop_at)
                and not (hung and hang is not None and hang.line.offset < self.stop_at)):
            return "stopped"
        if hung and hang is not None and (not crashed or failed_at < 0
                                          or failed_at >= hang.line.offset):
            return "hung"
        if crashed:
            return "crashed"
        return "ready" if self.ready_at >= 0 else "unknown"

    def cause(self, outcome: Outcome | None = None) -> RootCause | None:
        """What the verdict names as the reason: the hang marker of a hang, else the tracker's
        cause (a real exception, a stated failure, or a traceback cut before its line)."""
        outcome = outcome or self.outcome()
        if outcome == "hung" and self.hang is not None:
            line = self.hang.line
            return RootCause(line.message.strip(), line.proc, line.pid, line.offset,
                             self.tracker.symptoms, kind=self.hang.marker)
        return self.tracker.cause(self.ranker)

    def verdict(self) -> Explanation:
        services = self._service_verdicts()
        if services is not None:
            failed = [ex for ex in services.values() if ex.outcome in ("crashed", "hung")]
            if failed:
                first = min(failed, key=lambda ex: ex.root_cause.offset if ex.root_cause
                            else 1 << 62)
                return Explanation(first.outcome, first.last_phase, first.root_cause,
                                   first.symptoms, dict(self.noise.hidden), services)
        outcome = self.outcome()
        # unknown: no proof of a crash, but what went wrong so far is worth saying
        cause = self.cause(outcome) if outcome not in ("ready", "stopped") else None
        count, first = self.failed_requests()
        return Explanation(outcome, self.last_phase, cause, self.tracker.symptoms,
                           dict(self.noise.hidden), services, self.runner_up(cause), count,
                           first)

    def failed_requests(self) -> tuple[int, str | None]:
        """Requests that failed while serving: the 5xx answers (each request's traceback is
        answered with one) or, where the log has no access lines, the requests' tracebacks;
        the first one's error, else its answer."""
        tracker = self.tracker
        count = max(self.errors_answered, tracker.requests_failed)
        return count, tracker.first_request_failure or self.first_error_answer

    def runner_up(self, cause: RootCause | None) -> RootCause | None:
        """The second ranked candidate, when the first won narrowly in its tier, won by the
        tiers' rule over a higher score, is itself only a report of a failure elsewhere, or
        won because the second is what a good launch survived (a rule learned per profile:
        shown, not hidden)."""
        if cause is None or cause.score is None:
            return None
        ranked = self.tracker.ranked(self.ranker, 2)
        if len(ranked) < 2 or ranked[0].offset != cause.offset:
            return None
        second = ranked[1]
        # within a tier: a narrow lead; across the tiers: the rule beat the score
        close = second.score is not None and (
            cause.score - second.score < RUNNER_UP_MARGIN if second.elsewhere == cause.elsewhere
            else second.score > cause.score)
        return (second if close or cause.elsewhere or second.survived or second.before_ready
                else None)

    def _service_verdicts(self) -> dict[str, Explanation] | None:
        if len(self._services) < 2:
            return None
        for sub in self._services.values():
            sub.ranker = self.ranker  # each service's causes ranked as the file's
        return {name: sub.verdict() for name, sub in sorted(self._services.items())}

