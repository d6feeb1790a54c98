"""Running the agent on a host: one-shot calls and the long-lived watch stream.

The agent's archive and its spec go over stdin (see tui.core.protocol.AGENT_BOOTSTRAP); the
archive only until the host is known to keep it (then its hash alone names it); its stdout is
JSON lines. Failures to start it become typed errors naming the host and the fix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tui.core.errors import AgentError, RemoteModuleMissing
from tui.core.protocol import AGENT_BOOTSTRAP, AgentEvent, AgentFault, agent_stdin, decode
from tui.remote.agent_archive import agent_archive
from tui.remote.interface import Session
from tui.remote.session import MODULE_FIX, python_missing

# (host, interpreter) pairs whose cache holds the current archive: its bytes need not travel
_CACHED: set[tuple[str, str]] = set()
_MISSING = "agent_missing"


def _stdin(session: Session, target: AgentTarget, spec: dict[str, Any]) -> bytes:
    archive = agent_archive()
    known = (session.host, target.python) in _CACHED
    return agent_stdin(b"" if known else archive.data, spec)


def _missing(events: list[AgentEvent]) -> bool:
    return any(isinstance(ev, AgentFault) and ev.kind == _MISSING for ev in events)


@dataclass(frozen=True, slots=True)
class AgentTarget:
    """Which interpreter runs the agent on the host, and extra environment for it."""

    python: str
    env: dict[str, str] = field(default_factory=dict)

    def interpreter(self) -> list[str]:
        """The interpreter as an argv prefix, with its environment when there is one."""
        prefix = ["env", *(f"{k}={v}" for k, v in sorted(self.env.items()))] if self.env else []
        return [*prefix, self.python]

    def argv(self, subcommand: str) -> list[str]:
        return [*self.interpreter(), "-u", "-c", AGENT_BOOTSTRAP, agent_archive().digest,
                subcommand]


def _start_failure(session: Session, target: AgentTarget, code: int, stderr: str,
                   events: list[AgentEvent]) -> Exception | None:
    """The typed error of an agent that did not start or failed; `stderr` is the session's clean
    text (Session.stderr_text), so its last line may be quoted to the user as it is."""
    for ev in events:
        if isinstance(ev, AgentFault):
            if ev.kind == "missing_module":
                return RemoteModuleMissing(session.host, f"{target.python} cannot import "
                                           f"{ev.module or 'a module'} — {MODULE_FIX}")
            return AgentError(session.host, f"{ev.kind}: {ev.message}")
    if not events and (missing := python_missing(session.host, target.python, code, stderr)):
        return missing
    if code != 0:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {code}"
        return AgentError(session.host, f"agent failed: {last}")
    return None


async def call_agent(session: Session, target: AgentTarget, subcommand: str,
                     spec: dict[str, Any], timeout: float | None = 120) -> list[AgentEvent]:
    """Run a one-shot agent subcommand and return its decoded messages."""
    events = await _call(session, target, subcommand, spec, timeout)
    if _missing(events):  # the host's cache was emptied since: send the archive again
        _CACHED.discard((session.host, target.python))
        events = await _call(session, target, subcommand, spec, timeout)
    return events


async def _call(session: Session, target: AgentTarget, subcommand: str,
                spec: dict[str, Any], timeout: float | None) -> list[AgentEvent]:
    result = await session.run(target.argv(subcommand), _stdin(session, target, spec), timeout)
    events: list[AgentEvent] = []
    for raw in result.stdout.splitlines():
        if raw.strip():
            try:
                events.append(decode(raw, session.host))
            except AgentError:
                if result.returncode == 0:
                    raise
    if _missing(events):
        return events
    err = _start_failure(session, target, result.returncode, result.stderr_text(), events)
    if err is not None:
        raise err
    _CACHED.add((session.host, target.python))
    return events


async def stream_agent(session: Session, target: AgentTarget, subcommand: str,
                       spec: dict[str, Any]) -> AsyncIterator[AgentEvent]:
    """Run a streaming agent subcommand; yields events until the agent ends or is closed."""
    for attempt in (1, 2):
        stream = await session.stream(target.argv(subcommand), _stdin(session, target, spec))
        try:
            events_seen = 0
            while raw := await stream.readline():
                if not raw.strip():
                    continue
                event = decode(raw, session.host)
                if events_seen == 0 and _missing([event]) and attempt == 1:
                    _CACHED.discard((session.host, target.python))  # send the archive again
                    break
                events_seen += 1
                if isinstance(event, AgentFault) and event.kind == "missing_module":
                    raise _start_failure(session, target, 3, "", [event]) or AgentError(
                        session.host, event.message)
                if events_seen == 1:
                    _CACHED.add((session.host, target.python))
                yield event
            else:
                code = await stream.wait()
                if events_seen == 0:
                    err = _start_failure(session, target, code, await stream.stderr_text(), [])
                    if err is not None:
                        raise err
                return
        finally:
            stream.terminate()
