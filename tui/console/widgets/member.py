"""One member's full console: title, banner, the four panes (a grid, or tabs on a small
terminal) and the status line. The fleet keeps one per member, each fed only by its own
member's messages, so opening one shows that member's state and nothing of another's."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from tui.console.messages import (
    AlertRaised,
    GpusChanged,
    HistoryShown,
    LogLines,
    LogSkipped,
    PreflightShown,
    ProcsChanged,
    RootCauseFound,
    RunChanged,
    RunReset,
    ServingChanged,
    SpecDecodeChanged,
)
from tui.console.widgets.banner import Banner
from tui.console.widgets.gpus import GpuPane
from tui.console.widgets.logs import LogPane, LogView
from tui.console.widgets.procs import ProcPane
from tui.console.widgets.timeline import TimelinePane
from tui.core.logwindow import LogWindow

PANES = ("pane-logs", "pane-gpus", "pane-procs", "pane-timeline")
PANE_TITLES = {"pane-gpus": "GPUs", "pane-procs": "Processes", "pane-logs": "Logs",
               "pane-timeline": "Timeline"}
NARROW_BELOW = (120, 36)  # columns, rows: below either, panes collapse to tabs


class TimelineScroll(VerticalScroll):
    """The timeline's pane. The phases and the serving readout outgrow it on a 45-row
    terminal: it scrolls, and its bottom border says how much is below the edge."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._say_below()

    def watch_virtual_size(self) -> None:
        self._say_below()

    def on_resize(self) -> None:
        self._say_below()

    def _say_below(self) -> None:
        below = int(self.max_scroll_y - self.scroll_y)
        self.border_subtitle = f"↓ {below} more line{'s' * (below != 1)}" if below > 0 else ""


class MemberPanes(Vertical):
    """Routes a member's messages to its panes; the app decides the title and status words."""

    def __init__(self, window: LogWindow, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.window = window
        self.shown_pane = "pane-logs"
        self.narrow = False

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Banner(id="banner")
        with Container(id="body"):
            with Vertical(id="pane-gpus", classes="pane"):
                yield GpuPane(id="gpus")
            yield LogPane(self.window, id="pane-logs", classes="pane")
            with Vertical(id="pane-procs", classes="pane"):
                yield ProcPane(id="procs")
            with TimelineScroll(id="pane-timeline", classes="pane"):
                yield TimelinePane(id="timeline")
        yield Static(id="tabs")
        yield Static("connecting…", id="status", markup=False)  # its words quote the host

    def on_mount(self) -> None:
        for pane_id, title in PANE_TITLES.items():
            self.query_one(f"#{pane_id}").border_title = title

    @property
    def log_view(self) -> LogView:
        return self.query_one(LogView)

    def route(self, message: Message) -> None:
        """A bridge message to the pane that draws it."""
        if isinstance(message, (LogLines, LogSkipped, RootCauseFound)):
            self.query_one(LogPane).post_message(message)
        elif isinstance(message, ProcsChanged):
            self.query_one(ProcPane).post_message(message)
        elif isinstance(message, GpusChanged):
            self.query_one(GpuPane).post_message(message)
        elif isinstance(message, (PreflightShown, HistoryShown, SpecDecodeChanged, ServingChanged,
                                  RunChanged)):
            self.query_one(TimelinePane).post_message(message)
        elif isinstance(message, AlertRaised):
            self.query_one(Banner).post_message(message)
        elif isinstance(message, RunReset):
            self.query_one(LogPane).post_message(message)
            self.query_one(GpuPane).reset()
            self.query_one(TimelinePane).reset()
            self.query_one(Banner).clear()

    def set_title(self, title: Text) -> None:
        self.query_one("#title", Static).update(title)

    def set_status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    # -- layout ----------------------------------------------------------------------------

    def fit(self, width: int, height: int) -> None:
        """The grid, or one pane at a time with tabs when the terminal is small."""
        self.narrow = width < NARROW_BELOW[0] or height < NARROW_BELOW[1]
        self.query_one("#body").set_class(self.narrow, "narrow")
        for pane_id in PANES:
            self.query_one(f"#{pane_id}").set_class(pane_id == self.shown_pane, "-shown")
        tabs = self.query_one("#tabs", Static)
        tabs.display = self.narrow
        tabs.update("  ".join(f"[reverse] {PANE_TITLES[p]} [/]" if p == self.shown_pane
                              else f" {PANE_TITLES[p]} " for p in PANES) + "   (tab: next)")

    def show_pane(self, pane_id: str) -> None:
        self.shown_pane = pane_id
        self.fit(self.app.size.width, self.app.size.height)
        pane = self.query_one(f"#{pane_id}")
        target = pane.query_one(LogView) if pane_id == "pane-logs" else pane.children[0]
        target.focus()

    def cycle(self, focused: Widget | None, direction: int) -> None:
        """To the pane after (or before) the one holding the focus."""
        current = next((p for p in PANES if focused is not None
                        and self.query_one(f"#{p}") in focused.ancestors_with_self),
                       self.shown_pane)
        self.show_pane(PANES[(PANES.index(current) + direction) % len(PANES)])
