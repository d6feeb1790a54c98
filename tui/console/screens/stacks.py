"""The stacks pane: py-spy's dump of every process of the run, one section per process under
vLLM's name, where each is stuck first, the engine's own frames highlighted."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.core.logline import strip_escapes
from tui.core.stacks import ProcessStacks, stack_lines

_STYLES = {"header": "bold reverse", "thread": "cyan", "frame": "dim", "engine": "bold",
           "stuck": "bold yellow", "error": "red"}


def stacks_text(stacks: tuple[ProcessStacks, ...]) -> Text:
    """Where each process is stuck, then every process's threads and frames."""
    out = Text(no_wrap=True, overflow="ellipsis")
    for proc in stacks:
        out.append(strip_escapes(proc.summary()) + "\n", style="yellow" if proc.error is None
                   else "red")
    for proc in stacks:
        out.append("\n")
        for kind, line in stack_lines(proc):
            out.append(strip_escapes(line) + "\n", style=_STYLES[kind])
    return out


class StacksScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,d", "close", "Close", id="stacks-close")]

    def __init__(self, title: str, stacks: tuple[ProcessStacks, ...]) -> None:
        super().__init__()
        self.title_text, self.stacks = title, stacks

    def compose(self) -> ComposeResult:
        with Vertical(id="stacks-box"):
            yield Static(self.title_text, id="stacks-title", markup=False)  # a remote path
            with VerticalScroll(id="stacks-scroll"):
                yield Static(stacks_text(self.stacks), id="stacks-body")
            yield Static("↑ ↓ PgUp PgDn scroll · Esc closes", id="stacks-foot")

    def action_close(self) -> None:
        self.dismiss(None)
