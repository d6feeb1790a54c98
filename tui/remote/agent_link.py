"""Running the agent on a host: one-shot calls and the long-lived watch stream.

The agent's code and its spec go over stdin (see tui.core.protocol.AGENT_BOOTSTRAP); its
stdout is JSON lines. Failures to start it become typed errors naming the host and the fix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tui.core.errors import AgentError, RemoteModuleMissing
from tui.core.protocol import AGENT_BOOTSTRAP, AgentEvent, AgentFault, agent_stdin, decode
from tui.remote.session import MODULE_FIX, Session, python_missing


def agent_code() -> bytes:
    """The agent's source, shipped inside the package and sent to the host on every call."""
    return resources.files("tui.agent").joinpath("main.py").read_bytes()


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
        return [*self.interpreter(), "-u", "-c", AGENT_BOOTSTRAP, subcommand]


def _start_failure(session: Session, target: AgentTarget, code: int, stderr: str,
                   events: list[AgentEvent]) -> Exception | None:
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
    result = await session.run(target.argv(subcommand), agent_stdin(agent_code(), spec), timeout)
    events: list[AgentEvent] = []
    for raw in result.stdout.splitlines():
        if raw.strip():
            try:
                events.append(decode(raw, session.host))
            except AgentError:
                if result.returncode == 0:
                    raise
    err = _start_failure(session, target, result.returncode,
                         result.stderr.decode("utf-8", "replace"), events)
    if err is not None:
        raise err
    return events


async def stream_agent(session: Session, target: AgentTarget, subcommand: str,
                       spec: dict[str, Any]) -> AsyncIterator[AgentEvent]:
    """Run a streaming agent subcommand; yields events until the agent ends or is closed."""
    stream = await session.stream(target.argv(subcommand), agent_stdin(agent_code(), spec))
    events_seen = 0
    try:
        while True:
            raw = await stream.readline()
            if not raw:
                break
            if not raw.strip():
                continue
            event = decode(raw, session.host)
            events_seen += 1
            if isinstance(event, AgentFault) and event.kind == "missing_module":
                raise _start_failure(session, target, 3, "", [event]) or AgentError(
                    session.host, event.message)
            yield event
        code = await stream.wait()
        if events_seen == 0:
            err = _start_failure(session, target, code, await stream.stderr_text(), [])
            if err is not None:
                raise err
    finally:
        stream.terminate()
