"""The run's process tree as the console shows it: live and dead rows, in tree order.

Fed by the agent's snapshots (each dead process appears once with alive false) and by exit
events; a dead server process (or a helper that failed) keeps its row, marked with its exit
code, until the next launch; a helper that ended cleanly leaves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tui.core.procnames import is_server_role
from tui.core.protocol import Gpus, ProcInfo, Procs


@dataclass(frozen=True, slots=True)
class ProcRow:
    depth: int
    pid: int
    name: str
    state: str
    cpu: float | None
    rss: int | None
    gpu_mem: int | None
    started: float | None
    alive: bool
    exit: str | None  # "exit 1", "signal 9", "exit ?" once dead
    held_s: float | None = None  # stopped (T) or in D this long: amber in the pane
    cpid: int | None = None  # its pid inside a container, beside the host's in the pane


@dataclass(slots=True)
class _Known:
    info: ProcInfo
    exit: str | None = None
    ended_as: str | None = None  # the run's name for it once it ended (a forked child's own)


class ProcTree:
    """Every process of the run seen so far, by pid."""

    def __init__(self) -> None:
        self._procs: dict[int, _Known] = {}
        self._gpu_mem: dict[int, int] = {}

    def update(self, snap: Procs) -> None:
        for info in snap.procs:
            known = self._procs.get(info.pid)
            if known is None:
                self._procs[info.pid] = _Known(info, None if info.alive else "exit ?")
            else:
                known.info = info
                if not info.alive and known.exit is None:
                    known.exit = "exit ?"

    def ended(self, pid: int, name: str, code: int | None, signal: int | None) -> None:
        how = f"signal {signal}" if signal is not None else (
            f"exit {code}" if code is not None else "exit ?")
        known = self._procs.get(pid)
        if known is None:
            known = self._procs[pid] = _Known(
                ProcInfo(pid, None, name, name, None, None, None, None, False))
        known.info = ProcInfo(pid, known.info.ppid, known.info.name, known.info.cmd, "dead",
                              None, None, known.info.started, False, known.info.cpid)
        known.ended_as = name
        if known.exit in (None, "exit ?"):
            known.exit = how

    def gpus(self, snap: Gpus) -> None:
        mem: dict[int, int] = {}
        for gpu in snap.gpus:
            for holder in gpu.procs:
                if holder.mem is not None:
                    mem[holder.pid] = mem.get(holder.pid, 0) + holder.mem
        self._gpu_mem = mem

    def rows(self, names: Mapping[int, str] | None = None,
             held: Mapping[int, float] | None = None) -> tuple[ProcRow, ...]:
        """Tree order (parent before children, children by pid); `names` are vLLM's own names
        from the log prefixes, preferred to the kernel's for a live process; `held`: seconds a
        process has been stopped or in uninterruptible sleep (tui.core.stall)."""
        names, held = names or {}, held or {}
        children: dict[int | None, list[int]] = {}
        for pid, known in self._procs.items():
            parent = known.info.ppid if known.info.ppid in self._procs else None
            children.setdefault(parent, []).append(pid)
        out: list[ProcRow] = []

        def walk(pid: int, depth: int) -> None:
            info, dead = self._procs[pid].info, self._procs[pid].exit
            # a dead process is named as its end was told: a child forked under a worker's
            # title is that worker's child, not the worker its title and `names` say
            name = self._procs[pid].ended_as or names.get(pid, info.name)
            if (not info.alive and dead in ("exit 0", "exit ?") and not children.get(pid)
                    and not is_server_role(name)):
                return  # a helper that came and went (compiler, inspection): not news
            out.append(ProcRow(depth, pid, name,
                               "dead" if not info.alive else (info.state or "?"),
                               info.cpu if info.alive else None,
                               info.rss if info.alive else None,
                               self._gpu_mem.get(pid) if info.alive else None,
                               info.started, info.alive, None if info.alive else dead,
                               held.get(pid) if info.alive else None, info.cpid))
            for child in sorted(children.get(pid, ())):
                walk(child, depth + 1)

        for root in sorted(children.get(None, ())):
            walk(root, 0)
        return tuple(out)
