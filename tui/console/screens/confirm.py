"""Confirm a destructive action (kill, restart) with y, or cancel with n/Esc."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm-yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm-no")]

    def __init__(self, question: str, detail: str) -> None:
        super().__init__()
        self.question, self.detail = question, detail

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            # run ids, hosts and process names: the host's words, drawn as text
            yield Static(self.question, id="confirm-question", markup=False)
            yield Static(self.detail, id="confirm-detail", markup=False)
            yield Static("[b]y[/b]: yes    [b]n[/b] / Esc: no   (a reflexive Enter does nothing)",
                         id="confirm-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
