"""Logs pane: the run's log, noise-filtered by default, searchable, following or paused.

The lines live in a capped LogWindow; this widget only draws the visible ones (the Line API)
and asks the app, by message, for older pages when scrolled past the top. Remote text arrives
here with escapes already stripped by the decoder: nothing from the host reaches the terminal
but plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Key, MouseScrollUp
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Static

from tui.console.messages import LogLines, LogSkipped, RootCauseFound, RunReset
from tui.console.widgets.compact import GUTTER, compact_message, gutter
from tui.core.logline import keep_colours
from tui.core.logwindow import Entry, Fold, LogWindow, Row
from tui.core.units import size_words

CAUSE_MARK = "▶ ROOT CAUSE "
RUNNER_UP_MARK = "▷ RUNNER-UP "  # the ranking's second, when it was not sure
MAX_DRAWN = 2000
TAB = 8  # characters of one line drawn; the rest stays in the file
_ERROR_RE = re.compile(r"^(Traceback \(most recent call last\)|\w*(Error|Exception)\b)")
# A traceback's last line: the exception and its message (wrapped, never cut, when compact).
_EXCEPTION_RE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b:? ")


@dataclass
class NeedOlder(Message):
    """Scrolled past the oldest line held: the page before byte `before`, please (the view
    says whose log: the fleet holds one per member)."""

    before: int
    view: LogView

    @property
    def control(self) -> LogView:
        return self.view


def _coloured(raw: str, plain: str) -> Text:
    """vLLM's own colours (SGR only: every other sequence was removed by keep_colours), when
    they colour exactly the visible text; otherwise the plain text. Tabs are expanded here: a
    tab must not reach the terminal (it would move the cursor past the pane)."""
    if "\x1b[" in raw and len(raw) <= MAX_DRAWN:
        text = Text.from_ansi(keep_colours(raw), no_wrap=True, end="")
        text.expand_tabs(TAB)
        if text.plain == plain:
            return text
    return Text(plain, no_wrap=True)


class LogView(ScrollView, can_focus=True):
    """Draws the window's current view, line by line."""

    def __init__(self, window: LogWindow, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.window = window
        self.raw = False
        self.following = True
        self.cause_offset: int | None = None
        self.runner_up_offset: int | None = None
        self.shown_offset: int | None = None  # the line show_offset last centred
        self.pattern: re.Pattern[str] | None = None
        self.match_offset: int | None = None  # the current search match, by byte offset
        self._width = 0
        self._asked_before: int | None = None
        self._hold: int | None = None  # the byte offset of a line the view was jumped to
        self._layout_key: tuple[object, ...] | None = None
        self._layout: list[tuple[Text, bool]] = []

    # -- content ---------------------------------------------------------------------------

    def add(self, entries: tuple[Entry, ...]) -> None:
        evicted = self.window.evicted[self.raw]
        self.window.append(entries)
        dropped = self.window.evicted[self.raw] - evicted
        for entry in entries[-self.window.cap:]:  # the raw text's length bounds the drawn
            self._width = max(self._width, min(MAX_DRAWN, len(entry.raw)) + 4)
        self._resize()
        if self.following:
            self.scroll_end(animate=False)  # after the refresh that knows the new size
        elif self._hold is not None:
            self._center(self._hold)
        elif dropped:
            self.scroll_to(y=max(0, self.scroll_y - dropped), animate=False, immediate=True)
        self.refresh()

    def prepend(self, entries: list[Entry]) -> None:
        before = len(self.window.view(self.raw))
        self.window.prepend(entries)
        added = len(self.window.view(self.raw)) - before
        self._asked_before = None
        self._resize()
        self.scroll_to(y=self.scroll_y + max(0, added), animate=False, immediate=True)
        self.refresh()

    def skip(self, start: int, end: int) -> None:
        self.window.skip(start, end)
        self._asked_before = None
        self._resize()
        if self.following:
            self.scroll_end(animate=False)
        self.refresh()

    def reset(self) -> None:
        self.window.clear()
        self.cause_offset = self.runner_up_offset = self.pattern = self.match_offset = None
        self.following, self._width, self._asked_before, self._hold = True, 0, None, None
        self._resize()
        self.refresh()

    def _resize(self) -> None:
        self.virtual_size = Size(self._width, len(self.window.view(self.raw)))

    def set_raw(self, raw: bool) -> None:
        """Switch views, keeping the line at the top of the screen in place."""
        view = self.window.view(self.raw)
        top = view[int(self.scroll_y)].line.offset if int(self.scroll_y) < len(view) else None
        self.raw = raw
        self._resize()
        if self._hold is not None and not self.following:
            self._center(self._hold)
        elif self.following or top is None:
            self.scroll_end(animate=False, immediate=True)
        else:
            index = self.window.find(top, raw)
            self.scroll_to(y=index or 0, animate=False, immediate=True)
        self.refresh()

    # -- moving ----------------------------------------------------------------------------

    def follow(self, on: bool) -> None:
        self.following, self._hold = on, None
        if on:
            self.window.resume()
            self._resize()
            self.scroll_end(animate=False)
            self.refresh()

    def show_offset(self, offset: int) -> bool:
        """Put the line at `offset` in the middle of the screen and hold the view there."""
        if self.window.find(offset, self.raw) is None:
            return False
        self.following = False
        self.shown_offset = offset
        self._center(offset)
        return True

    def _center(self, offset: int) -> None:
        """Scroll so the line at byte `offset` is mid-screen, once the layout knows the new
        virtual size (lines that arrived in the same batch would otherwise clamp the scroll
        short of them), and keep it there through resizes, new lines, older pages and the
        raw/filtered switch (held by offset, not by index)."""
        self._hold = offset

        def scroll() -> None:
            index = self.window.find(offset, self.raw)
            if index is not None:
                self.scroll_to(y=max(0, index - self.size.height // 2), animate=False,
                               immediate=True)
            self.refresh()
        self.call_after_refresh(scroll)

    def search(self, pattern: re.Pattern[str] | None) -> int:
        self.pattern, self.match_offset = pattern, None
        self.refresh()
        return self.step(+1) if pattern is not None else 0

    def step(self, direction: int) -> int:
        """Move to the next (+1) or previous (-1) match; how many matches there are."""
        if self.pattern is None:
            return 0
        hits = self.window.matches(self.pattern, self.raw)
        if not hits:
            self.match_offset = None
            self.refresh()
            return 0
        view = self.window.view(self.raw)
        current = None if self.match_offset is None else self.window.find(self.match_offset,
                                                                          self.raw)
        here = current if current is not None else int(self.scroll_y) - 1
        after = [h for h in hits if (h > here if direction > 0 else h < here)]
        target = (after[0] if direction > 0 else after[-1]) if after else (
            hits[0] if direction > 0 else hits[-1])
        self.match_offset = view[target].line.offset
        self.following = False
        self._center(self.match_offset)
        return len(hits)

    def on_resize(self) -> None:
        if self.following:
            self.scroll_end(animate=False)
        elif self._hold is not None:
            self._center(self._hold)

    def forget_request(self) -> None:
        self._asked_before = None

    def _maybe_older(self) -> None:
        start = self.window.start
        if int(self.scroll_y) == 0 and start > 0 and self._asked_before != start:
            self._asked_before = start
            self.post_message(NeedOlder(start, self))

    def on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        """The wheel up holds the view (and loads older lines at the top), as the keys do."""
        self.following, self._hold = False, None
        self.call_after_refresh(self._maybe_older)

    # upward moves land at once (not after the next refresh), so that reaching the top asks
    # for the older page in the same keypress

    def action_scroll_up(self) -> None:
        self.following, self._hold = False, None
        self.scroll_to(y=self.scroll_y - 1, animate=False, immediate=True)
        self._maybe_older()

    def action_page_up(self) -> None:
        self.following, self._hold = False, None
        self.scroll_to(y=self.scroll_y - self.scrollable_content_region.height, animate=False,
                       immediate=True)
        self._maybe_older()

    def action_scroll_home(self) -> None:
        self.following, self._hold = False, None
        self.scroll_to(y=0, animate=False, immediate=True)
        self._maybe_older()

    def action_scroll_end(self) -> None:
        self.follow(True)

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new == 0 and old != 0 and not self.following:
            self._maybe_older()

    # -- drawing ---------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x = self.scroll_offset.x
        width = self.size.width
        layout = self._screen()
        if y >= len(layout):
            return Strip.blank(width, self.rich_style)
        text, wrapped = layout[y]
        segments = [Segment(s.text, s.style) for s in text.render(self.app.console)
                    if s.text != "\n"]
        start = 0 if wrapped else scroll_x  # a wrapped row already fits the pane
        return Strip(segments).crop_extend(start, start + width, self.rich_style)

    def _screen(self) -> list[tuple[Text, bool]]:
        """The screen's lines, each (text, part of a wrapped row), laid out once per frame: from
        the top row down, or, following or at the end, from the newest row up, so that rows
        wrapped onto several lines never push the newest one below the edge."""
        view = self.window.view(self.raw)
        width, height = self.size.width, self.size.height
        top = int(self.scroll_offset.y)
        at_end = self.following or top >= max(0, len(view) - height)
        key = (top, len(view), view[-1].line.offset if view else None, width, height, self.raw,
               at_end, self.cause_offset, self.runner_up_offset, self.match_offset, self.pattern)
        if key == self._layout_key:
            return self._layout
        lines: list[tuple[Text, bool]] = []
        if at_end:
            index = len(view) - 1
            while index >= 0 and len(lines) < height:
                lines[:0] = self._row_lines(view[index], width)
                index -= 1
            lines = lines[-height:] if len(lines) > height else lines
        else:
            index = top
            while index < len(view) and len(lines) < height:
                lines += self._row_lines(view[index], width)
                index += 1
            lines = lines[:height]
        self._layout_key, self._layout = key, lines
        return lines

    def _row_lines(self, entry: Row, width: int) -> list[tuple[Text, bool]]:
        """A row as screen lines: one, or the cause and exception lines of the compact view
        wrapped to the pane's width (never cut)."""
        text = self.line_text(entry, entry.line.offset == self.match_offset)
        if self.raw or text.cell_len <= width or not self._wraps(entry):
            return [(text, False)]
        return self._indented(text, width)

    def _indented(self, text: Text, width: int) -> list[tuple[Text, bool]]:
        """The first screen line whole; the rest indented under the message (past the gutter)."""
        text.no_wrap = False
        first = text.wrap(self.app.console, width)[0]
        rest = text[len(first.plain):]
        rest = rest[len(rest.plain) - len(rest.plain.lstrip()):]  # the space it broke at
        first.end = ""
        lines: list[tuple[Text, bool]] = [(first, True)]
        for part in rest.wrap(self.app.console, max(8, width - GUTTER)):
            part.end = ""
            lines.append((Text.assemble(" " * GUTTER, part), True))
        return lines

    def _wraps(self, entry: Row) -> bool:
        line = entry.line
        return line.offset in (self.cause_offset, self.runner_up_offset) or (
            not isinstance(entry, Fold) and bool(_EXCEPTION_RE.match(line.message)))

    def line_text(self, entry: Row, current: bool) -> Text:
        """One line as the user sees it: compact (time, process tag and level in a gutter) in
        the filtered view, as written in the raw one; marked, dimmed, highlighted; a folded
        row as its first line's gutter and what the row holds."""
        line = entry.line
        if self.raw:
            text, shift = self._as_written(entry), 0
        else:
            head = gutter(line)
            body = entry.summary() if isinstance(entry, Fold) else compact_message(line)
            if len(body) > MAX_DRAWN:
                body = body[:MAX_DRAWN] + f" … ({len(body) - MAX_DRAWN} more characters)"
            text, shift = Text(body.expandtabs(TAB), no_wrap=True, end=""), head.cell_len
            if isinstance(entry, Fold):
                text.stylize("dim", len(line.message))
        rule = entry.rule
        plain = text.plain
        if line.offset == self.cause_offset:
            text.stylize("bold red")
            text = Text.assemble((CAUSE_MARK, "bold white on red"), text, end="")
            shift += len(CAUSE_MARK)
        elif line.offset == self.runner_up_offset:
            text.stylize("bold yellow")
            text = Text.assemble((RUNNER_UP_MARK, "bold black on yellow"), text, end="")
            shift += len(RUNNER_UP_MARK)
        elif rule is not None:
            text.stylize("dim")
            kind = "harmless" if rule.kind == "harmless" else "hidden"
            text.append(f"  [{kind}: {rule.label}]", style="dim italic")
        elif line.level in ("ERROR", "CRITICAL") or _ERROR_RE.match(line.message):
            text.stylize("bold red")
        elif line.level == "WARNING":
            text.stylize("yellow")
        if not self.raw:
            text = Text.assemble(head, text, no_wrap=True, end="")
        if self.pattern is not None:
            for m in self.pattern.finditer(plain):
                if m.end() > m.start():
                    text.stylize("black on yellow", m.start() + shift, m.end() + shift)
        if current:
            text.stylize("reverse")
        return text

    def _as_written(self, entry: Row) -> Text:
        line = entry.line
        plain = line.plain if len(line.plain) <= MAX_DRAWN else (
            line.plain[:MAX_DRAWN] + f" … ({len(line.plain) - MAX_DRAWN} more characters)")
        plain = plain.expandtabs(TAB)
        if isinstance(entry, Fold):
            head = line.plain[:len(line.plain) - len(line.message)] \
                if line.message and line.plain.endswith(line.message) else ""
            text = Text((head + entry.summary()).expandtabs(TAB)[:MAX_DRAWN], no_wrap=True)
            text.stylize("dim", len(head))
            return text
        return _coloured(line.raw, plain)


class LogPane(Vertical):
    """Header (view, follow, what the rules hid), the lines, and the search box."""

    def __init__(self, window: LogWindow | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.window = window if window is not None else LogWindow()
        self.search_text = ""
        self.match_count = 0

    def compose(self) -> ComposeResult:
        yield Static(id="log-header")
        yield LogView(self.window, id="log-view")
        yield Input(placeholder="regex — Enter to search, Esc to close", id="log-search")

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def on_mount(self) -> None:
        self.query_one("#log-search", Input).display = False
        self.update_header()

    def on_log_lines(self, message: LogLines) -> None:
        self.view.add(message.entries)
        self.update_header()

    def on_root_cause_found(self, message: RootCauseFound) -> None:
        self.view.cause_offset = message.offset
        self.view.runner_up_offset = message.runner_up
        self.view.show_offset(message.offset)
        self.update_header()

    def step_cause(self) -> bool:
        """Show the other of the root cause and its runner-up (the cause when neither is
        shown); False when there is no cause yet."""
        view = self.view
        marks = [o for o in (view.cause_offset, view.runner_up_offset) if o is not None]
        if not marks:
            return False
        at = view.shown_offset if view.shown_offset in marks else marks[-1]
        return view.show_offset(marks[(marks.index(at) + 1) % len(marks)])

    def on_log_skipped(self, message: LogSkipped) -> None:
        self.view.skip(message.start, message.end)
        self.update_header()

    def on_run_reset(self, message: RunReset) -> None:
        self.view.reset()
        self.update_header()

    def update_header(self) -> None:
        view = self.view
        w = self.window
        parts = [Text("raw" if view.raw else "filtered", style="bold"),
                 Text(" · following" if view.following else " · paused",
                      style="green" if view.following else "yellow")]
        if w.detached:
            parts.append(Text(f" · scrolled back: {w.missed} newer lines — space to follow",
                              style="yellow"))
        elif w.start > 0:
            unread = f", {size_words(w.skipped)} unread" if w.skipped else ""
            parts.append(Text(f" · older lines in the remote file{unread} (scroll up to load)",
                              style="dim"))
        if view.pattern is not None:
            parts.append(Text(f" · /{self.search_text}/ {self.match_count} matches",
                              style="cyan"))
        hidden = sum(w.hidden.values())
        if hidden:
            top = sorted(w.hidden.items(), key=lambda kv: -kv[1])
            parts.append(Text(f" · hid {hidden}: " + ", ".join(f"{k} {n}" for k, n in top),
                              style="dim"))
        harmless = sum(w.harmless.values())
        if harmless:
            parts.append(Text(" · harmless: " + ", ".join(
                f"{k} {n}" for k, n in w.harmless.items()), style="dim"))
        self.query_one("#log-header", Static).update(Text.assemble(*parts))

    # -- actions the app forwards ----------------------------------------------------------

    def toggle_raw(self) -> None:
        view = self.view
        view.set_raw(not view.raw)
        if view.pattern is not None:  # the same search, counted in the other view
            self.match_count = len(view.window.matches(view.pattern, view.raw))
        self.update_header()

    def toggle_follow(self) -> None:
        self.view.follow(not self.view.following)
        self.update_header()

    def open_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.value = self.search_text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        box = self.query_one("#log-search", Input)
        text = event.value
        if not text:
            self.view.search(None)
            self.search_text, self.match_count = "", 0
        else:
            try:
                pattern = re.compile(text)
            except re.error as exc:
                self.app.notify(f"not a regular expression: {exc}", severity="error",
                                markup=False)
                return
            self.search_text = text
            self.match_count = self.view.search(pattern)
            if not self.match_count:
                self.app.notify(f"no line matches /{text}/", severity="warning", markup=False)
        box.display = False
        self.view.focus()
        self.update_header()

    def on_key(self, event: Key) -> None:
        """Esc in the search box closes it (the search already made stays)."""
        box = self.query_one("#log-search", Input)
        if event.key == "escape" and box.display:
            event.stop()
            box.display = False
            self.view.focus()

    def step(self, direction: int) -> None:
        self.match_count = self.view.step(direction)
        self.update_header()
