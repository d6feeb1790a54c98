"""Processes pane: the run's tree (API server → engine core → workers) with pid, vLLM name,
state, CPU, RSS, GPU memory and age; the dead stay, marked with their exit code; a process
stopped, or in uninterruptible sleep for a few seconds, is amber with how long."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tui.console.messages import ProcsChanged
from tui.console.widgets.format import age, size
from tui.core.proctree import ProcRow
from tui.core.stall import HELD_AFTER_S

COLUMNS = (("pid", 7), ("process", 19), ("state", 14), ("CPU %", 5), ("RSS", 6),
           ("GPU", 6), ("age", 6))


class ProcPane(DataTable[Text | str]):
    """A table redrawn in place from each ProcsChanged."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = False
        for label, width in COLUMNS:
            self.add_column(label, key=label, width=width)

    def on_procs_changed(self, message: ProcsChanged) -> None:
        self.show(message.rows, message.now)

    def show(self, rows: tuple[ProcRow, ...], now: float) -> None:
        cursor = self.cursor_row
        self.clear()
        for row in rows:
            name = "  " * row.depth + ("└ " if row.depth else "") + row.name
            if row.alive:
                state: Text | str = row.state
                if row.held_s is not None and (row.state != "disk-sleep"
                                               or row.held_s >= HELD_AFTER_S):
                    state = Text(f"{row.state} {row.held_s:.0f}s", style="bold yellow")
                cells: list[Text | str] = [
                    str(row.pid), Text(name), state,  # a process names itself: text, not markup
                    "—" if row.cpu is None else f"{row.cpu:.0f}", size(row.rss),
                    size(row.gpu_mem) if row.gpu_mem else "—", age(row.started, now)]
            else:
                dead = "bold red"
                cells = [Text(str(row.pid), style=dead), Text(name, style=dead),
                         Text(f"DEAD {row.exit or ''}".strip(), style="bold white on red"),
                         "", "", "", ""]
            self.add_row(*cells, key=str(row.pid))
        if rows:
            self.move_cursor(row=min(cursor, len(rows) - 1))
