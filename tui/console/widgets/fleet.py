"""Fleet pane: a row per run and, under it, a row per member (host): state, phase, GPUs and
the alert that stands, coloured like the banner. Arrow keys move; the app opens the row's
member on Enter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from tui.core.logline import strip_escapes
from tui.core.state import State

COLUMNS = (("run / host", 18), ("role", 10), ("state", 9), ("phase", 24), ("GPUs", 16),
           ("alert", None))  # the alert takes what is left: 32 columns at 120
# the banner's colours: DEAD red, STALLED (and a kill under way) amber, READY green
STATE_STYLES = {State.DEAD: "bold red", State.STALLED: "bold #ffaf00",
                State.KILLING: "bold #ffaf00", State.READY: "bold green",
                State.STOPPED: "dim"}
ALERT_STYLES = {"dead": "red", "error": "red", "stalled": "#ffaf00", "timeout": "#ffaf00",
                "link": "#ffaf00"}


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One line of the fleet: a run (`member` False) or one of its members."""

    key: str
    label: str
    role: str
    state: State
    phase: str = ""
    gpus: str = ""
    alert: str = ""
    alert_kind: str = ""
    member: bool = True


class FleetTable(DataTable[Text], inherit_bindings=False):
    """Rows redrawn in place; Enter is the app's (declared with the other keys)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "scroll_top", "Top", show=False),
        Binding("end", "scroll_bottom", "Bottom", show=False),
    ]

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = False
        for label, width in COLUMNS:
            self.add_column(label, key=label, width=width)

    def show(self, rows: Sequence[FleetRow]) -> None:
        """Draw `rows`: cells change in place while the rows are the same ones."""
        keys = [row.key for row in rows]
        if keys != [str(k.value) for k in self.rows]:
            cursor = self.cursor_row
            self.clear()
            for row in rows:
                self.add_row(*cells(row), key=row.key)
            if rows:
                self.move_cursor(row=min(cursor, len(rows) - 1))
            return
        for row in rows:
            for (column, _), cell in zip(COLUMNS, cells(row), strict=True):
                old = self.get_cell(row.key, column)
                if (old.plain, old.style) != (cell.plain, cell.style):
                    self.update_cell(row.key, column, cell, update_width=True)


def cells(row: FleetRow) -> tuple[Text, ...]:
    """A row's cells as plain text (profiles and logs never drive the terminal)."""
    label = strip_escapes(row.label)
    return (Text("  └ " + label if row.member else label, style="" if row.member else "bold"),
            Text(strip_escapes(row.role), style="dim"),
            Text(row.state.value.upper(), style=STATE_STYLES.get(row.state, "")),
            Text(strip_escapes(row.phase)),
            Text(row.gpus),
            Text(strip_escapes(row.alert), style=ALERT_STYLES.get(row.alert_kind, "")))
