"""Processes pane: the run's tree (API server → engine core → workers) with pid (in a
container, the pid inside it beside it: `4312 (11)`), vLLM name, state, CPU, RSS, GPU memory
and age; the dead stay, marked with their exit code; a process stopped, or in uninterruptible
sleep for a few seconds, is amber with how long."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tui.console.messages import ProcsChanged
from tui.console.widgets.format import age, size
from tui.core.proctree import ProcRow
from tui.core.stall import HELD_AFTER_S

COLUMNS = (("pid", 7), ("process", 19), ("state", 14), ("CPU %", 5), ("RSS", 6),
           ("GPU", 6), ("age", 6))
NAME_MIN = 13  # the process column gives up to this much width to `4312 (11)` pids


def pid_cell(row: ProcRow) -> str:
    """The host pid, and the pid inside the container beside it when the process has one."""
    return str(row.pid) if row.cpid is None or row.cpid == row.pid else f"{row.pid} ({row.cpid})"


def widths(pid_width: int) -> tuple[tuple[str, int], ...]:
    """COLUMNS with the pid column `pid_width` wide, the process column narrower by as much
    (down to NAME_MIN): the table keeps its width, so it fits 80 columns as before."""
    (pid_label, base), (name_label, name), *rest = COLUMNS
    wide = min(pid_width, base + name - NAME_MIN)
    return ((pid_label, max(base, wide)), (name_label, name - max(0, wide - base)), *rest)


class ProcPane(DataTable[Text | str]):
    """A table redrawn in place from each ProcsChanged."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = False
        self.pid_width = COLUMNS[0][1]
        self._columns(self.pid_width)

    def _columns(self, pid_width: int) -> None:
        for label, width in widths(pid_width):
            self.add_column(label, key=label, width=width)

    def on_procs_changed(self, message: ProcsChanged) -> None:
        self.show(message.rows, message.now)

    def show(self, rows: tuple[ProcRow, ...], now: float) -> None:
        cursor = self.cursor_row
        wanted = max((len(pid_cell(row)) for row in rows), default=0)
        if wanted > self.pid_width:  # a container's pids: widened once, never narrowed back
            self.pid_width = wanted
            self.clear(columns=True)
            self._columns(wanted)
        else:
            self.clear()
        for row in rows:
            name = "  " * row.depth + ("└ " if row.depth else "") + row.name
            if row.alive:
                state: Text | str = row.state
                if row.held_s is not None and (row.state != "disk-sleep"
                                               or row.held_s >= HELD_AFTER_S):
                    state = Text(f"{row.state} {row.held_s:.0f}s", style="bold yellow")
                cells: list[Text | str] = [
                    pid_cell(row), Text(name), state,  # a process names itself: text, not markup
                    "—" if row.cpu is None else f"{row.cpu:.0f}", size(row.rss),
                    size(row.gpu_mem) if row.gpu_mem else "—", age(row.started, now)]
            else:
                dead = "bold red"
                cells = [Text(pid_cell(row), style=dead), Text(name, style=dead),
                         Text(f"DEAD {row.exit or ''}".strip(), style="bold white on red"),
                         "", "", "", ""]
            self.add_row(*cells, key=str(row.pid))
        if rows:
            self.move_cursor(row=min(cursor, len(rows) - 1))
