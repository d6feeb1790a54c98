"""Which process a stall hangs on, from the agent's process samples: scheduler state held over
time and CPU over the last interval.

A frozen launch looks the same in the log whatever froze it; the processes tell them apart:
- one process stopped (T: SIGSTOP, a debugger) or in uninterruptible sleep (D: a driver or disk
  call) for more than a few seconds, while the others wait on it;
- one process spinning at full CPU while the others sleep (a busy loop, a compile gone wild);
- every process of the engine asleep at 0 % (a deadlock, or a collective waiting for a peer
  that never comes: another host, a rank that died without a word).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tui.core.protocol import ProcInfo, Procs

# States that hold a process where it is: the agent's words for /proc's T, t and D.
HELD = {"stopped": "stopped (SIGSTOP, or a debugger holds it)",
        "tracing-stop": "stopped by a tracer",
        "disk-sleep": "in uninterruptible sleep (D: a driver or disk call that does not return)"}
HELD_AFTER_S = 3.0  # a moment in D is normal (page faults, NFS); this long is not
SPINNING_CPU = 90.0  # percent of one core
ASLEEP_CPU = 2.0
_QUIET_CPU = 5.0


@dataclass(frozen=True, slots=True)
class Suspect:
    """One finding, already in words; `pid` is None when it is about all of them."""

    pid: int | None
    name: str
    why: str

    def words(self) -> str:
        return f"{self.name} (pid {self.pid}) {self.why}" if self.pid is not None else self.why


@dataclass(slots=True)
class _Held:
    state: str
    since: float


@dataclass
class ProcWatch:
    """The latest sample of each live process and since when it is held (T, t or D)."""

    latest: dict[int, ProcInfo] = field(default_factory=dict)
    held: dict[int, _Held] = field(default_factory=dict)

    def feed(self, snap: Procs, at: float) -> None:
        for info in snap.procs:
            if not info.alive:
                self.latest.pop(info.pid, None)
                self.held.pop(info.pid, None)
                continue
            self.latest[info.pid] = info
            state = info.state or ""
            if state in HELD:
                known = self.held.get(info.pid)
                if known is None or known.state != state:
                    self.held[info.pid] = _Held(state, at)
            else:
                self.held.pop(info.pid, None)

    def ended(self, pid: int) -> None:
        self.latest.pop(pid, None)
        self.held.pop(pid, None)

    def held_for(self, at: float, at_least: float = HELD_AFTER_S) -> dict[int, float]:
        """Processes held (stopped or in D) for `at_least` seconds: pid -> seconds."""
        return {pid: at - h.since for pid, h in self.held.items() if at - h.since >= at_least}

    def suspects(self, at: float, names: Mapping[int, str]) -> tuple[Suspect, ...]:
        """What the processes say about a stall, the likeliest first."""
        def name(pid: int) -> str:
            return names.get(pid) or self.latest[pid].name

        held = [Suspect(pid, name(pid), f"is {HELD[self.held[pid].state]} for "
                        f"{seconds:.0f}s")
                for pid, seconds in sorted(self.held_for(at).items(), key=lambda kv: -kv[1])]
        if held:
            others = len(self.latest) - len(held)
            if others > 0:
                held.append(Suspect(None, "", f"the other {others} process"
                                    f"{'es' if others > 1 else ''} wait on "
                                    f"{'it' if len(held) == 1 else 'them'}"))
            return tuple(held)
        sampled = {pid: p.cpu for pid, p in self.latest.items() if p.cpu is not None}
        if len(sampled) < 2:
            return ()
        busy = [pid for pid, cpu in sampled.items() if cpu >= SPINNING_CPU]
        quiet = [pid for pid, cpu in sampled.items() if cpu <= _QUIET_CPU]
        if busy and len(busy) + len(quiet) == len(sampled) and quiet:
            return tuple(Suspect(pid, name(pid), f"spins at {sampled[pid]:.0f} % CPU while "
                                 "the others sleep") for pid in sorted(busy))
        if all(cpu <= ASLEEP_CPU for cpu in sampled.values()):
            return (Suspect(None, "", f"all {len(sampled)} processes sleep at 0 % CPU: a "
                            "deadlock, or a collective waiting for a peer that never comes "
                            "(another host, a rank that died)"),)
        return ()
