"""What the console watches: runs, each one profile on one or more hosts (its members).

The console treats every member of every run alike (one bridge, one log window, one set of
panes each) but acts on a run only as a whole, through this protocol: a run spanning several
hosts is started, killed and restarted by its own coordinator, never member by member.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Protocol

from tui.supervise.supervisor import Supervisor

# What ends a watcher (the console, the headless demo) from outside: its terminal hung up (a
# tmux window closed, the SSH session to the jump host dropped), or a polite TERM. The servers
# it watches live on; the demo stops its own.
HANGUP_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class Member:
    """One host of a run: its label, what the run does there, the supervisor watching it."""

    host: str
    role: str
    sup: Supervisor


class Run(Protocol):
    """One profile's launch: `members` are fixed for the run's life, in launch order. What
    the methods return is the implementation's own (the console reads the members' events)."""

    name: str  # the profile's name
    members: list[Member]

    async def start(self, *, launch: bool, kill_leftovers: bool, grace: float) -> object:
        """Attach to the live run, else launch (when allowed); raises SpecconsoleError."""

    async def kill(self, grace: float) -> object:
        """Kill every member's processes (TERM, KILL after the grace, sweep, verify)."""

    async def restart(self, grace: float) -> object:
        """Kill, verify, and launch a new run on every member."""

    async def close(self) -> object:
        """Stop watching; the servers keep running."""


class SingleRun:
    """A profile on one host: one member, the server, under one Supervisor."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.name = sup.profile.name
        self.members = [Member(sup.profile.host.target, "server", sup)]

    async def start(self, *, launch: bool, kill_leftovers: bool, grace: float) -> None:
        await self.sup.start(launch=launch, kill_leftovers=kill_leftovers, grace=grace)

    async def kill(self, grace: float) -> None:
        await self.sup.kill(grace)

    async def restart(self, grace: float) -> None:
        await self.sup.restart(grace)

    async def close(self) -> None:
        await self.sup.close()

