"""The console: a Textual app over one Supervisor, driven only by its events.

Panes (GPUs, processes, logs, timeline), a banner that cannot be missed, a status line in words,
keys declared as data. The bridge turns supervisor events into small messages for the panes; the
app routes them, rings the bell and names the tmux window on DEAD, STALLED and READY, and runs
kill and restart after a confirmation. Quitting leaves the server running (the demo stops its
own simulated server) and says so.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Mapping

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Container, Vertical
from textual.events import Event, InputEvent, Resize
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from tui.alerts import announce, restore_command, run_quietly
from tui.bridge import Bridge
from tui.core.errors import PreflightFailed, SpecconsoleError
from tui.core.logwindow import DEFAULT_CAP, Entry, LogWindow
from tui.core.protocol import GpuHolder
from tui.core.state import State
from tui.core.status import status_line
from tui.heap import QuietCollector
from tui.keys import KEYS, bindings
from tui.messages import (
    AlertRaised,
    GpusChanged,
    HistoryShown,
    LogLines,
    PreflightShown,
    ProcsChanged,
    RootCauseFound,
    RunChanged,
    RunReset,
    SpecDecodeChanged,
)
from tui.screens.confirm import ConfirmScreen
from tui.screens.help import HelpScreen
from tui.supervisor import Supervisor
from tui.widgets.banner import Banner
from tui.widgets.gpus import GpuPane
from tui.widgets.logs import LogPane, LogView, NeedOlder
from tui.widgets.procs import ProcPane
from tui.widgets.timeline import TimelinePane

PANES = ("pane-logs", "pane-gpus", "pane-procs", "pane-timeline")
PANE_TITLES = {"pane-gpus": "GPUs", "pane-procs": "Processes", "pane-logs": "Logs",
               "pane-timeline": "Timeline"}
NARROW_BELOW = (120, 36)  # columns, rows: below either, panes collapse to tabs
PAGE_BYTES = 256 * 1024  # one scroll-back page fetched from the host
WINDOW_MARKS = {"dead": "✗ DEAD", "stalled": "⚠ STALLED", "ready": "✓ READY"}


class ConsoleApp(App[str]):
    """The console for one profile: returns, on quit, what it says about the server."""

    CSS_PATH = "specconsole.tcss"
    TITLE = "specconsole"
    BINDINGS = bindings()
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, sup: Supervisor, *, launch: bool = True, demo: bool = False,
                 kill_grace: float = 10.0, clock: Callable[[], float] = time.time,
                 env: Mapping[str, str] | None = None, log_cap: int = DEFAULT_CAP,
                 profile_arg: str | None = None, kill_leftovers: bool = False,
                 heap: QuietCollector | None = None) -> None:
        super().__init__()
        self.heap = heap  # full garbage collections at quiet moments (specconsole's own run)
        self.sup = sup
        self.bridge = Bridge(sup)
        self.launch_allowed = launch
        self.kill_leftovers = kill_leftovers  # --kill-leftovers: without asking, on start
        self.offered: tuple[GpuHolder, ...] = ()  # leftovers the refusal on screen names
        self.demo = demo
        self.kill_grace = kill_grace
        self.clock = clock
        self.env = os.environ if env is None else env
        self.window = LogWindow(log_cap)
        self.profile_arg = profile_arg or sup.profile.key
        self.shown_pane = "pane-logs"
        self.narrow = False
        self.busy = False  # a kill or restart is running
        self.demo_stopped = False
        self.idle_text = ""  # why nothing is watched, when nothing is
        self.last_state: State | None = None

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Banner(id="banner")
        with Container(id="body"):
            with Vertical(id="pane-gpus", classes="pane"):
                yield GpuPane(id="gpus")
            yield LogPane(self.window, id="pane-logs", classes="pane")
            with Vertical(id="pane-procs", classes="pane"):
                yield ProcPane(id="procs")
            with Vertical(id="pane-timeline", classes="pane"):
                yield TimelinePane(id="timeline")
        yield Static(id="tabs")
        yield Static("connecting…", id="status")
        yield Footer()

    def on_mount(self) -> None:
        for pane_id, title in PANE_TITLES.items():
            self.query_one(f"#{pane_id}").border_title = title
        self._title()
        self._layout(self.size.width, self.size.height)
        self.query_one(LogView).focus()
        self.set_interval(1.0, self._tick)
        if self.heap is not None:
            self.set_interval(0.25, self._collect_if_quiet)
        self.run_worker(self._supervise(), name="supervise", exit_on_error=False)

    async def on_unmount(self) -> None:
        """However the app ends, stop watching and drop the session (the server stays)."""
        await self.sup.close()

    async def on_event(self, event: Event) -> None:
        """A key or the mouse: the user is looking, so no full collection for a while."""
        if self.heap is not None and isinstance(event, InputEvent):
            self.heap.busy()
        await super().on_event(event)

    def _collect_if_quiet(self) -> None:
        assert self.heap is not None
        self.heap.poll()

    def on_resize(self, event: Resize) -> None:
        self._layout(event.size.width, event.size.height)

    def _layout(self, width: int, height: int) -> None:
        self.narrow = width < NARROW_BELOW[0] or height < NARROW_BELOW[1]
        self.query_one("#body").set_class(self.narrow, "narrow")
        for pane_id in PANES:
            self.query_one(f"#{pane_id}").set_class(pane_id == self.shown_pane, "-shown")
        tabs = self.query_one("#tabs", Static)
        tabs.display = self.narrow
        tabs.update("  ".join(f"[reverse] {PANE_TITLES[p]} [/]" if p == self.shown_pane
                              else f" {PANE_TITLES[p]} " for p in PANES) + "   (tab: next)")

    def _title(self) -> None:
        sup, run = self.sup, self.sup.run
        what = f" · run {run.run_id} · pid {run.pid}" if run is not None else ""
        state = sup.machine.state.value.upper()
        title = Text.assemble((f" {state} ", "bold reverse"), f" {sup.profile.key}{what}",
                              (" · simulated engine" if self.demo else "", "italic"),
                              (" · specconsole", "dim"), no_wrap=True, overflow="ellipsis")
        self.query_one("#title", Static).update(title)

    # -- the supervisor --------------------------------------------------------------------

    async def _supervise(self) -> None:
        queue = self.sup.subscribe()
        self.run_worker(self._pump(queue), name="pump", exit_on_error=False)
        await self._start(launch=self.launch_allowed, kill_leftovers=self.kill_leftovers)

    async def _start(self, *, launch: bool, kill_leftovers: bool) -> None:
        """Attach or launch; a failure is on the banner and the status line, never raised."""
        try:
            await self.sup.start(launch=launch, kill_leftovers=kill_leftovers,
                                 grace=self.kill_grace)
        except PreflightFailed as exc:
            self._refused(exc)
        except SpecconsoleError as exc:
            self._alert(AlertRaised("error", f"ERROR — {exc}"))
            self._idle("not watching anything · r to launch, q to quit")
        except Exception as exc:  # a bug: said on screen, never a traceback over the panes
            self._alert(AlertRaised("error", f"ERROR — internal: {exc!r}"))
            self._idle("not watching anything · q to quit")
        self._title()

    def _refused(self, exc: PreflightFailed) -> None:
        """Preflight's refusal on screen; where leftovers of ended runs hold the GPUs, the key
        that kills exactly them (then launches) is shown with it."""
        self.offered = self.sup.leftovers()
        detail = str(exc)
        if self.offered:
            pids = ", ".join(str(h.pid) for h in self.offered)
            detail += (f"\nleftovers of ended runs hold the GPUs (pids {pids}): press K to kill "
                       "exactly them, then launch")
            self._idle("preflight refused: leftovers hold the GPUs · K to kill them and "
                       "launch · q to quit")
        else:
            self._idle("preflight refused the launch · fix it, then r to try again")
        self._alert(AlertRaised("error", "PREFLIGHT REFUSED — nothing was launched", detail))
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The leftovers key is shown only while a refusal that names leftovers is."""
        if action == "kill_leftovers":
            return bool(self.offered)
        return True

    def _idle(self, text: str) -> None:
        """No run to watch: the status line says so (and the clock stops ticking it)."""
        self.idle_text = text
        self.query_one("#status", Static).update(text)

    async def _pump(self, queue: asyncio.Queue[object]) -> None:
        while True:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < 10_000:
                batch.append(queue.get_nowait())
            try:
                for message in self.bridge.translate(batch, self.clock()):
                    self._route(message)
            except Exception as exc:  # one bad batch must not freeze the console
                self._alert(AlertRaised("error", f"ERROR — internal: {exc!r}"))

    def _route(self, message: Message) -> None:
        if isinstance(message, (LogLines, RootCauseFound)):
            if self.heap is not None:
                self.heap.busy()
            self.query_one(LogPane).post_message(message)
        elif isinstance(message, ProcsChanged):
            self.query_one(ProcPane).post_message(message)
        elif isinstance(message, GpusChanged):
            self.query_one(GpuPane).post_message(message)
        elif isinstance(message, (PreflightShown, HistoryShown, SpecDecodeChanged)):
            self.query_one(TimelinePane).post_message(message)
        elif isinstance(message, RunChanged):
            self.query_one(TimelinePane).post_message(message)
            self._status(message)
        elif isinstance(message, AlertRaised):
            self._alert(message)
        elif isinstance(message, RunReset):
            self.query_one(LogPane).post_message(message)
            self.query_one(GpuPane).reset()
            self.query_one(TimelinePane).reset()
            self.query_one(Banner).clear()
            self._title()

    def _status(self, message: RunChanged) -> None:
        if self.sup.run is None and self.idle_text:
            return
        self.query_one("#status", Static).update(status_line(message.view, message.now))
        if message.view.state is not self.last_state:
            self.last_state = message.view.state
            self._title()

    def _alert(self, alert: AlertRaised) -> None:
        self.query_one(Banner).post_message(alert)
        mark = WINDOW_MARKS.get(alert.kind)
        if mark is not None and alert.ring:
            self.bell()
            flash = f"specconsole: {alert.title}" if self.sup.profile.alerts.tmux else None
            self.run_worker(announce(f"{mark} {self.sup.profile.key}", self.env, flash),
                            exit_on_error=False)

    def _tick(self) -> None:
        if not self.query(TimelinePane):  # the timer can fire while quitting empties the screen
            return
        now = self.clock()
        message = RunChanged(self.bridge.view(), now)
        self.query_one(TimelinePane).post_message(message)
        self._status(message)

    # -- scroll-back -----------------------------------------------------------------------

    def on_need_older(self, message: NeedOlder) -> None:
        self.run_worker(self._older(message.before), exit_on_error=False)

    async def _older(self, before: int) -> None:
        view = self.query_one(LogView)
        try:
            lines = await self.sup.read_log(max(0, before - PAGE_BYTES), before)
        except (SpecconsoleError, OSError) as exc:
            view.forget_request()  # scrolling up again asks again
            self.notify(f"older lines could not be read: {exc}", severity="warning")
            return
        view.prepend([Entry(e.line, e.rule) for e in lines])
        self.query_one(LogPane).update_header()

    # -- actions ---------------------------------------------------------------------------

    def _confirm(self, question: str, detail: str, then: Callable[[], object]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(then(), exit_on_error=False)  # type: ignore[arg-type]
        self.push_screen(ConfirmScreen(question, detail), answered)

    def action_kill(self) -> None:
        run = self.sup.run
        if run is None or self.busy:
            self.notify("no run to kill" if run is None else "a kill or restart is running")
            return
        self._confirm(f"Kill run {run.run_id} on {self.sup.profile.host.target}?",
                      f"TERM the process group (pid {run.pid}), KILL whatever is left after "
                      f"{self.kill_grace:g}s, sweep every process carrying the run id, then "
                      "check that none remains and that GPU memory was released.", self._kill)

    async def _kill(self) -> None:
        self.busy = True
        try:
            await self.sup.kill(self.kill_grace)
        except SpecconsoleError as exc:
            self._alert(AlertRaised("error", f"KILL FAILED — {exc}"))
        finally:
            self.busy = False
            self._title()

    def action_restart(self) -> None:
        if self.busy:
            self.notify("a kill or restart is running")
            return
        run = self.sup.run
        what = f"run {run.run_id}" if run is not None else "nothing running"
        self._confirm(f"Restart {self.sup.profile.key}? ({what})",
                      "Kill the run (TERM, KILL after the grace, sweep, verify), then run "
                      "preflight and launch a new run with a fresh timeline.", self._restart)

    async def _restart(self) -> None:
        self.busy = True
        try:
            await self.sup.restart(self.kill_grace)
        except PreflightFailed as exc:
            self._refused(exc)
        except SpecconsoleError as exc:
            self._alert(AlertRaised("error", f"RESTART FAILED — {exc}"))
        finally:
            self.busy = False
            self._title()

    def action_kill_leftovers(self) -> None:
        if not self.offered or self.busy:
            self.notify("a kill or restart is running" if self.busy else
                        "no leftovers to kill: preflight named none")
            return
        holders = self.offered
        named = "; ".join(f"pid {h.pid} ({h.name}, run {h.run_id}) on GPU {h.gpu}"
                          for h in holders)
        self._confirm(f"Kill {len(holders)} leftover process(es) on "
                      f"{self.sup.profile.host.target}, then launch?",
                      f"{named}. Each is signalled only if it is still the process preflight "
                      f"saw and still holds GPU memory: TERM, KILL after {self.kill_grace:g}s, "
                      "then check it is gone and its GPU memory released; then preflight and "
                      "launch.", lambda: self._kill_leftovers(holders))

    async def _kill_leftovers(self, holders: tuple[GpuHolder, ...]) -> None:
        self.busy = True
        self.offered = ()
        self.refresh_bindings()
        self._alert(AlertRaised("killing", "KILLING LEFTOVERS — pids "
                                + ", ".join(str(h.pid) for h in holders)))
        try:
            await self.sup.kill_leftovers(holders, self.kill_grace)
        except PreflightFailed as exc:
            self._refused(exc)
            return
        except SpecconsoleError as exc:
            self._alert(AlertRaised("error", f"KILL FAILED — {exc}"))
            return
        finally:
            self.busy = False
        await self._start(launch=True, kill_leftovers=False)

    def action_toggle_raw(self) -> None:
        self.query_one(LogPane).toggle_raw()

    def action_search(self) -> None:
        self._show_pane("pane-logs")
        self.query_one(LogPane).open_search()

    def action_next_match(self) -> None:
        self.query_one(LogPane).step(+1)

    def action_prev_match(self) -> None:
        self.query_one(LogPane).step(-1)

    def action_toggle_follow(self) -> None:
        self.query_one(LogPane).toggle_follow()

    def action_next_pane(self) -> None:
        self._cycle(+1)

    def action_prev_pane(self) -> None:
        self._cycle(-1)

    def _cycle(self, direction: int) -> None:
        if len(self.screen_stack) > 1:  # a confirmation or help is open: tab is theirs
            return
        current = next((p for p in PANES if self.focused is not None
                        and self.query_one(f"#{p}") in self.focused.ancestors_with_self),
                       self.shown_pane)
        self._show_pane(PANES[(PANES.index(current) + direction) % len(PANES)])

    def _show_pane(self, pane_id: str) -> None:
        self.shown_pane = pane_id
        self._layout(self.size.width, self.size.height)
        pane = self.query_one(f"#{pane_id}")
        target = pane.query_one(LogView) if pane_id == "pane-logs" else pane.children[0]
        target.focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        await self.action_quit_console()

    async def action_quit_console(self) -> None:
        if self.busy:
            self.notify("a kill or restart is running: quit once it has ended",
                        severity="warning")
            return
        run, host = self.sup.run, self.sup.profile.host.target
        if self.demo and run is not None:
            message = "demo: stopped the simulated server; nothing is left running"
            self._alert(AlertRaised("info", "stopping the simulated server before quitting"))
            await self._kill()
            self.demo_stopped = self.sup.machine.state is State.STOPPED
        elif run is not None and self.sup.machine.state.live:
            message = (f"the server keeps running: run {run.run_id} on {host} (pid {run.pid}); "
                       f"reattach with `specconsole {self.profile_arg}`, stop it with "
                       f"`specconsole kill {self.profile_arg}`")
            self._alert(AlertRaised("info", "quitting — " + message))
            await asyncio.sleep(0.3)  # long enough to read that it stays up
        else:
            message = "nothing of this profile is running"
        await self.sup.close()
        restore = restore_command(self.env)
        if restore is not None:
            await run_quietly(restore, self.env)
        self.exit(message)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key in KEYS:
            yield SystemCommand(key.description, key.help,
                                lambda action=key.action: self.run_action(action))
