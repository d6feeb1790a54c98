"""The banner: DEAD in red, STALLED and TIMEOUT in amber, READY in green, the link and kill in
between. Hidden until something happens; it never scrolls away."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.console.messages import AlertRaised
from tui.core.logline import strip_escapes

# the worst news stays up: a later, milder alert does not hide a death
_RANK = {"dead": 5, "error": 4, "stalled": 3, "timeout": 3, "ending": 3, "link": 3, "killing": 2,
         "stopped": 2, "ready": 1, "warning": 1, "info": 0}
KINDS = tuple(_RANK)


class Banner(Static):
    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)  # type: ignore[arg-type]
        self.kind: str | None = None
        self.display = False

    def on_alert_raised(self, message: AlertRaised) -> None:
        self.show(message.kind, message.title, message.detail)

    def show(self, kind: str, title: str, detail: str = "") -> None:
        sticky = self.kind in ("dead", "error") and kind not in ("killing", "stopped", "dead")
        if sticky and _RANK[kind] < _RANK[self.kind or "info"]:
            return
        for k in KINDS:
            self.set_class(k == kind, f"-{k}")
        self.kind = kind
        text = Text(strip_escapes(title), style="bold")  # local and remote words alike
        if detail:
            text.append("\n" + "\n".join(strip_escapes(line) for line in detail.splitlines()))
        self.update(text)
        self.display = True

    def clear(self) -> None:
        self.kind = None
        self.display = False
        self.update("")
