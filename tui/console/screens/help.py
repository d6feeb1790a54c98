"""Help: every key, from the same declarations as the bindings."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.console.keys import KEYS


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close", id="help-close")]

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2))
        table.add_column(style="bold cyan")
        table.add_column()
        for key in KEYS:
            table.add_row(key.display or key.key, key.help)
        table.add_row("↑ ↓ PgUp PgDn", "Scroll the focused pane (the log loads older lines "
                      "from the host past its top)")
        table.add_row("End", "Back to the end of the log, following")
        table.add_row("ctrl+p", "Command palette: every action by name")
        self.table = table
        with Vertical(id="help-box"):
            yield Static("specconsole keys", id="help-title")
            yield Static(table)
            yield Static("Esc or ? closes", id="help-foot")

    def action_close(self) -> None:
        self.dismiss(None)
