"""Timeline pane: preflight's verdicts, then the phases in order with start and duration, the
current one as a bar with shard progress, the elapsed time and the ETA."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tui.core.describe import duration
from tui.core.protocol import Check
from tui.core.status import RunView, timeline_rows
from tui.messages import PreflightShown, RunChanged
from tui.widgets.format import bar


class TimelinePane(Widget, can_focus=True):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.view: RunView | None = None
        self.now = 0.0
        self.checks: tuple[Check, ...] = ()

    def on_run_changed(self, message: RunChanged) -> None:
        self.view, self.now = message.view, message.now
        self.refresh(layout=True)

    def on_preflight_shown(self, message: PreflightShown) -> None:
        self.checks = message.checks
        self.refresh(layout=True)

    def reset(self) -> None:
        self.view, self.checks = None, ()
        self.refresh(layout=True)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return len(self.render().split())

    def render(self) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        if self.checks:
            bad = [c for c in self.checks if not c.ok]
            out.append("preflight ", style="bold")
            out.append(f"{len(self.checks) - len(bad)}/{len(self.checks)} ok",
                       style="green" if not bad else "yellow")
            for check in bad:
                style = "bold red" if check.severity == "error" else "yellow"
                out.append(f"\n  {'✗' if check.severity == 'error' else '!'} {check.check}: "
                           f"{check.message}", style=style)
            out.append("\n")
        view, now = self.view, self.now
        if view is None or view.launched_at is None:
            out.append("not launched yet", style="dim")
            return out
        width = max(20, self.size.width)
        for row in timeline_rows(view, now):
            style = "bold red" if row.failed else ("bold" if row.current else "")
            out.append(f"{row.mark} ", style="red" if row.failed else
                       ("yellow" if row.current else "green"))
            out.append(f"{row.label:<22}", style=style)
            out.append(f" {'+' + duration(row.start_s):>8} {duration(row.duration_s):>7}")
            if row.detail:
                out.append(f" {row.detail}", style="" if row.current else "dim")
            room = width - 42 - len(row.detail)
            if row.current and row.progress is not None and room >= 6:
                out.append(" ")
                out.append_text(bar(row.progress, room - 1, "yellow"))
            out.append("\n")
        out.append(f"elapsed {duration(view.elapsed(now))}", style="bold")
        if view.expected_load_s is not None:
            out.append(f" · expected {duration(view.expected_load_s)}")
        eta = view.eta(now)
        if eta is not None:
            out.append(f" · ETA ~{duration(eta)}" if eta > 0 else " · over the expected time",
                       style="cyan" if eta > 0 else "yellow")
        return out
