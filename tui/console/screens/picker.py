"""Pick a profile when `specconsole` is run without one."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from tui.console.terminal import ConsoleDriver


class PickerApp(App[Path | None]):
    """Lists the profiles found; Enter returns the chosen path, q or Esc returns None."""

    CSS_PATH = "../specconsole.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "exit_none", "Quit", id="picker-quit")]

    def __init__(self, profiles: list[Path]) -> None:
        super().__init__(driver_class=ConsoleDriver)
        self.profiles = profiles

    def compose(self) -> ComposeResult:
        yield Static("specconsole — choose a launch profile (Enter opens it)", id="picker-title")
        if self.profiles:
            yield OptionList(*(Option(f"{p.stem:<28} {p}", id=str(i))
                               for i, p in enumerate(self.profiles)), id="picker-list")
        else:
            yield Static("No profiles in ./profiles or ~/.config/specconsole/profiles. "
                         "Write one (see README: Writing a profile), or try `specconsole demo`.",
                         id="picker-empty")
        yield Footer()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.exit(self.profiles[event.option_index])

    def action_exit_none(self) -> None:
        self.exit(None)
