"""The console: a Textual app over one or several runs, driven only by their events.

One run on one host is that run's panes (GPUs, processes, logs, timeline), a banner that
cannot be missed, a status line in words, keys declared as data. Several (profiles, or hosts of
one profile) open on the fleet: a row per run and per host; Enter opens a host's panes, Escape
comes back. Every member's events are consumed all the time, each by its own bridge into its
own panes, so a death in a run nobody is looking at still rings the bell, names the tmux window
and shows on its row. Kill and restart act on a whole run after a confirmation. Quitting leaves
the servers running (the demo stops its own) and says so for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Vertical
from textual.events import Event, InputEvent, Resize
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ContentSwitcher, DataTable, Footer, Static

from tui.console.alerts import announce, restore_command, run_quietly
from tui.console.bridge import Bridge
from tui.console.heap import QuietCollector
from tui.console.keys import KEYS, bindings
from tui.console.messages import (
    AlertRaised,
    GpusChanged,
    LogLines,
    RootCauseFound,
    RunChanged,
    RunReset,
)
from tui.console.screens.confirm import ConfirmScreen
from tui.console.screens.help import HelpScreen
from tui.console.screens.stacks import StacksScreen
from tui.console.terminal import ConsoleDriver
from tui.console.widgets.fleet import FleetRow, FleetTable
from tui.console.widgets.logs import LogPane, NeedOlder
from tui.console.widgets.member import MemberPanes
from tui.console.widgets.timeline import TimelinePane
from tui.core.errors import JobNeverStarts, PreflightFailed, SpecconsoleError
from tui.core.fleetview import alert_words, gpu_words, phase_words, worst
from tui.core.logline import strip_escapes
from tui.core.logwindow import DEFAULT_CAP, LogWindow
from tui.core.protocol import GpuHolder, Leftover, leftover_words
from tui.core.state import State
from tui.core.status import status_line
from tui.supervise.events import StacksTaken
from tui.supervise.runs import HANGUP_SIGNALS, Member, Run, SingleRun
from tui.supervise.supervisor import Supervisor

PAGE_BYTES = 256 * 1024  # one scroll-back page fetched from the host
WINDOW_MARKS = {"dead": "✗ DEAD", "stalled": "⚠ STALLED", "timeout": "⚠ NOT READY",
                "ending": "⚠ TIME LIMIT", "ready": "✓ READY"}
# what a fleet row keeps
FLEET_ALERTS = frozenset({"dead", "stalled", "timeout", "ending", "link", "error"})
PANE_ACTIONS = frozenset({"toggle_raw", "search", "next_match", "prev_match", "toggle_follow",
                          "next_pane", "prev_pane"})  # keys of an open member's panes
FLEET_REDRAW_S = 0.2


@dataclass(eq=False)
class Watch:
    """One member as the console follows it: its bridge and log window, its panes, and what
    its fleet row and the leftovers key need."""

    run: Run
    member: Member
    window: LogWindow
    panes: MemberPanes
    bridge: Bridge = field(init=False)
    alert: AlertRaised | None = None  # the last DEAD/STALLED/link/error: its fleet row's
    offered: tuple[Leftover, ...] = ()  # leftovers the refusal on screen names
    idle_text: str = ""  # why nothing is watched, when nothing is
    last_state: State | None = None

    def __post_init__(self) -> None:
        self.bridge = Bridge(self.member.sup)

    @property
    def sup(self) -> Supervisor:
        return self.member.sup




class ConsoleApp(App[str]):
    """The console for one run or a fleet: returns, on quit, what it says about the servers."""

    CSS_PATH = "specconsole.tcss"
    TITLE = "specconsole"
    BINDINGS = bindings()
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, runs: Supervisor | Sequence[Run], *, launch: bool = True,
                 demo: bool = False, kill_grace: float = 10.0,
                 clock: Callable[[], float] = time.time, env: Mapping[str, str] | None = None,
                 log_cap: int = DEFAULT_CAP, profile_arg: str | Sequence[str] | None = None,
                 kill_leftovers: bool = False, heap: QuietCollector | None = None) -> None:
        """`runs`: one Supervisor (a run on one host) or the runs of a fleet; `profile_arg`:
        how the user named each run's profile (one per run), for the words on quitting."""
        super().__init__(driver_class=ConsoleDriver)
        # no scroll animations: over SSH in tmux each frame of one is sent, and a key (home,
        # page up) must land at once, the older page it asks for read while the user waits
        self.animation_level = "none"
        self.heap = heap  # full garbage collections at quiet moments (specconsole's own run)
        self.runs: list[Run] = [SingleRun(runs)] if isinstance(runs, Supervisor) else list(runs)
        self.watches: list[Watch] = []
        for run in self.runs:
            for member in run.members:
                window = LogWindow(log_cap)
                panes = MemberPanes(window, id=f"member-{len(self.watches)}")
                self.watches.append(Watch(run, member, window, panes))
        args = [profile_arg] if isinstance(profile_arg, str) else list(profile_arg or ())
        self.profile_args = args or [run.name for run in self.runs]
        if len(self.profile_args) != len(self.runs):
            raise ValueError("one profile argument per run")
        self.fleet = len(self.watches) > 1
        self.viewing_fleet = self.fleet  # the fleet is shown (else `current`'s panes are)
        self.current = self.watches[0]
        self.row_targets: list[Watch] = []  # the member each fleet row opens, in row order
        self.fleet_stale = False
        self.launch_allowed = launch
        self.kill_leftovers = kill_leftovers  # --kill-leftovers: without asking, on start
        self.demo = demo
        self.kill_grace = kill_grace
        self.clock = clock
        self.env = os.environ if env is None else env
        self.busy: set[int] = set()  # id() of each run a kill or restart is running on
        self.demo_stopped = False

    @property
    def sup(self) -> Supervisor:
        """The supervisor of the member whose panes are open (the only one, without a fleet)."""
        return self.current.sup

    @property
    def window(self) -> LogWindow:
        return self.current.window

    def _members_of(self, run: Run) -> list[Watch]:
        return [w for w in self.watches if w.run is run]

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        if self.fleet:
            with ContentSwitcher(id="views", initial="fleet"):
                with Vertical(id="fleet"):
                    yield Static(id="fleet-title")
                    yield FleetTable(id="fleet-table")
                yield from (w.panes for w in self.watches)
        else:
            yield self.current.panes
        yield Footer()

    def on_mount(self) -> None:
        for w in self.watches:
            self._title(w)
        self._layout(self.size.width, self.size.height)
        if self.fleet:
            self._draw_fleet()
            self.query_one(FleetTable).focus()
            self.set_interval(FLEET_REDRAW_S, self._redraw_fleet)
        else:
            self.current.panes.log_view.focus()
        self.set_interval(1.0, self._tick)
        loop = asyncio.get_running_loop()
        for hangup in HANGUP_SIGNALS:  # not on a loop outside the main thread (some tests)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(hangup, self._hung_up)
        if self.heap is not None:
            self.set_interval(0.25, self._collect_if_quiet)
        self.run_worker(self._supervise(), name="supervise", exit_on_error=False)

    def _hung_up(self) -> None:
        """The terminal went away (its tmux window closed, the SSH session to the jump host
        dropped) or we were asked to end: leave at once, drawing nothing more. The servers
        keep running as on `q`; the demo's is stopped by its caller (cli.main), as on `q`."""
        self.exit(self._farewell() if not self.demo else None)

    async def on_unmount(self) -> None:
        """However the app ends, stop watching and drop the sessions (the servers stay)."""
        for run in self.runs:
            await run.close()

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
        for w in self.watches:
            w.panes.fit(width, height)

    def _title(self, w: Watch) -> None:
        sup, run = w.sup, w.sup.run
        what = f" · run {run.run_id} · pid {run.pid}" if run is not None else ""
        role = f" · {strip_escapes(w.member.role)}" if len(w.run.members) > 1 else ""
        state = sup.machine.state.value.upper()
        title = Text.assemble((f" {state} ", "bold reverse"),
                              f" {strip_escapes(sup.profile.key)}{role}{what}",
                              (" · simulated engine" if self.demo else "", "italic"),
                              (" · specconsole", "dim"), no_wrap=True, overflow="ellipsis")
        w.panes.set_title(title)
        self.fleet_stale = True

    # -- the fleet -------------------------------------------------------------------------

    def _fleet_rows(self) -> list[FleetRow]:
        """A row per run (its worst member's state), then a row per member."""
        rows: list[FleetRow] = []
        self.row_targets = []
        for i, run in enumerate(self.runs):
            members = self._members_of(run)
            views = [w.bridge.view() for w in members]
            hosts = f"{len(members)} host{'s' if len(members) > 1 else ''}"
            rows.append(FleetRow(f"run-{i}", run.name, hosts, worst(v.state for v in views),
                                 member=False))
            self.row_targets.append(members[0])
            for w, view in zip(members, views, strict=True):
                alert = w.alert
                rows.append(FleetRow(
                    str(w.panes.id), w.member.host, w.member.role, view.state, phase_words(view),
                    gpu_words(w.bridge.gpus.rows()),
                    alert_words(alert.kind, alert.title, view) if alert is not None else "",
                    alert.kind if alert is not None else ""))
                self.row_targets.append(w)
        return rows

    def _draw_fleet(self) -> None:
        self.fleet_stale = False
        self.query_one(FleetTable).show(self._fleet_rows())
        states = Counter(w.sup.machine.state for w in self.watches)
        counts = " · ".join(f"{states[s]} {s.value}" for s in State if states[s])
        self.query_one("#fleet-title", Static).update(Text.assemble(
            (" FLEET ", "bold reverse"),
            f" {len(self.runs)} runs · {len(self.watches)} hosts · {counts}",
            (" · ↑↓ choose, Enter opens, Esc comes back · specconsole", "dim"),
            no_wrap=True, overflow="ellipsis"))

    def _redraw_fleet(self) -> None:
        """On a timer, which may fire while the app removes its widgets at exit: then the
        table or the title may already be gone (a NoMatches in the fleet test, once)."""
        if self.fleet_stale and self.query(FleetTable) and self.query("#fleet-title"):
            self._draw_fleet()

    def _selected(self) -> Watch:
        """The member the keys act on: the one open, or the fleet row's under the cursor (a
        run's row: its first member's)."""
        if not self.viewing_fleet or not self.row_targets:
            return self.current
        row = self.query_one(FleetTable).cursor_row
        return self.row_targets[min(max(row, 0), len(self.row_targets) - 1)]

    def action_open_member(self) -> None:
        if self.viewing_fleet:
            self._open(self._selected())

    @on(DataTable.RowSelected, "#fleet-table")
    def _clicked(self) -> None:
        self.action_open_member()

    @on(DataTable.RowHighlighted, "#fleet-table")
    def _moved(self) -> None:
        self.refresh_bindings()  # the leftovers key follows the row's run

    def _open(self, w: Watch) -> None:
        """Show one member's panes (they have been fed all along)."""
        self.current = w
        self.viewing_fleet = False
        self.query_one(ContentSwitcher).current = w.panes.id
        w.panes.show_pane(w.panes.shown_pane)
        self.refresh_bindings()

    def action_show_fleet(self) -> None:
        if not self.fleet or self.viewing_fleet:
            return
        self.viewing_fleet = True
        self.query_one(ContentSwitcher).current = "fleet"
        self._draw_fleet()
        table = self.query_one(FleetTable)
        table.move_cursor(row=next(i for i, r in enumerate(table.rows)
                                   if r.value == self.current.panes.id))
        table.focus()
        self.refresh_bindings()

    # -- the supervisors -------------------------------------------------------------------

    async def _supervise(self) -> None:
        for w in self.watches:
            self.run_worker(self._pump(w, w.sup.subscribe()), name="pump", exit_on_error=False)
        await asyncio.gather(*(self._start(run, launch=self.launch_allowed,
                                           kill_leftovers=self.kill_leftovers)
                               for run in self.runs))

    async def _start(self, run: Run, *, launch: bool, kill_leftovers: bool) -> None:
        """Attach or launch; a failure is on the banner and the status line, never raised."""
        members = self._members_of(run)
        try:
            await run.start(launch=launch, kill_leftovers=kill_leftovers, grace=self.kill_grace)
        except PreflightFailed as exc:
            self._refused(run, exc)
        except SpecconsoleError as exc:
            for w in members:
                self._alert(w, AlertRaised("error", f"ERROR — {exc}"))
                self._idle(w, "not watching anything · r to launch, q to quit")
        except Exception as exc:  # a bug: said on screen, never a traceback over the panes
            for w in members:
                self._alert(w, AlertRaised("error", f"ERROR — internal: {exc!r}"))
                self._idle(w, "not watching anything · q to quit")
        for w in members:
            self._title(w)

    def _refused(self, run: Run, exc: PreflightFailed) -> None:
        """Preflight's refusal on screen; where leftovers of ended runs hold the GPUs, the key
        that kills exactly them (then launches) is shown with it."""
        for w in self._members_of(run):
            w.offered = w.sup.leftovers()
            detail = str(exc)
            if w.offered:
                detail += (f"\nleftovers of ended runs hold the GPUs "
                           f"({leftover_words(w.offered)}): press K to kill exactly them, "
                           "then launch")
                self._idle(w, "preflight refused: leftovers hold the GPUs · K to kill them and "
                              "launch · q to quit")
            elif isinstance(exc, JobNeverStarts):
                self._idle(w, "the scheduler will not start the job · fix it, then r to try "
                              "again")
            else:
                self._idle(w, "preflight refused the launch · fix it, then r to try again")
            title = ("JOB CANNOT START — cancelled, nothing runs" if isinstance(exc, JobNeverStarts)
                     else "PREFLIGHT REFUSED — nothing was launched")
            self._alert(w, AlertRaised("error", title, detail))
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The leftovers key is shown only while a refusal that names leftovers is; the fleet's
        keys and the panes' keys only where they act."""
        if action == "kill_leftovers":
            return any(w.offered for w in self._members_of(self._selected().run))
        if action == "open_member":
            return self.viewing_fleet
        if action == "show_fleet":
            return self.fleet and not self.viewing_fleet
        if action in PANE_ACTIONS:
            return not self.viewing_fleet
        return True

    def _idle(self, w: Watch, text: str) -> None:
        """No run to watch: the status line says so (and the clock stops ticking it)."""
        w.idle_text = text
        w.panes.set_status(text)

    async def _pump(self, w: Watch, queue: asyncio.Queue[object]) -> None:
        while True:
            batch = [await queue.get()]
            while not queue.empty() and len(batch) < 10_000:
                batch.append(queue.get_nowait())
            try:
                for message in w.bridge.translate(batch, self.clock()):
                    self._route(w, message)
            except Exception as exc:  # one bad batch must not freeze the console
                self._alert(w, AlertRaised("error", f"ERROR — internal: {exc!r}"))

    def _route(self, w: Watch, message: Message) -> None:
        if isinstance(message, AlertRaised):
            self._alert(w, message)
            return
        if self.heap is not None and isinstance(message, (LogLines, RootCauseFound)):
            self.heap.busy()
        w.panes.route(message)
        if isinstance(message, RunChanged):
            self._status(w, message)
        elif isinstance(message, RunReset):
            w.alert = None
            self._title(w)
        if isinstance(message, (RunChanged, GpusChanged)):
            self.fleet_stale = True

    def _status(self, w: Watch, message: RunChanged) -> None:
        if w.sup.run is None and w.idle_text:
            return
        w.panes.set_status(status_line(message.view, message.now))
        if message.view.state is not w.last_state:
            w.last_state = message.view.state
            self._title(w)

    def _alert(self, w: Watch, alert: AlertRaised) -> None:
        """On the member's banner and fleet row; a transition also rings the bell and names
        the tmux window, whichever member is open."""
        w.panes.route(alert)
        if alert.kind in FLEET_ALERTS:
            w.alert = alert
            self.fleet_stale = True
        mark = WINDOW_MARKS.get(alert.kind)
        if mark is not None and alert.ring:
            self.bell()
            flash = f"specconsole: {alert.title}" if w.sup.profile.alerts.tmux else None
            self.run_worker(announce(f"{mark} {w.sup.profile.key}", self.env, flash),
                            exit_on_error=False)

    def _tick(self) -> None:
        if not self.query(TimelinePane):  # the timer can fire while quitting empties the screen
            return
        now = self.clock()
        for w in self.watches:
            message = RunChanged(w.bridge.view(), now)
            w.panes.route(message)
            self._status(w, message)
        self.fleet_stale = True

    # -- scroll-back -----------------------------------------------------------------------

    def on_need_older(self, message: NeedOlder) -> None:
        w = next(w for w in self.watches if w.panes.log_view is message.view)
        self.run_worker(self._older(w, message.before), exit_on_error=False)

    async def _older(self, w: Watch, before: int) -> None:
        view = w.panes.log_view
        try:
            lines = await w.sup.read_log(max(0, before - PAGE_BYTES), before)
        except (SpecconsoleError, OSError) as exc:
            view.forget_request()  # scrolling up again asks again
            self.notify(f"older lines could not be read: {exc}", severity="warning", markup=False)
            return
        view.prepend(lines)
        w.panes.query_one(LogPane).update_header()

    # -- actions ---------------------------------------------------------------------------

    def _confirm(self, question: str, detail: str, then: Callable[[], object]) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(then(), exit_on_error=False)  # type: ignore[arg-type]
        self.push_screen(ConfirmScreen(question, detail), answered)

    def action_kill(self) -> None:
        """Kill the selected run: every member, through the run."""
        run = self._selected().run
        watched = [w for w in self._members_of(run) if w.sup.run is not None]
        if not watched or id(run) in self.busy:
            self.notify("no run to kill" if not watched else "a kill or restart is running")
            return
        then = (f"KILL whatever is left after {self.kill_grace:g}s, sweep every process carrying "
                "the run id, then check that none remains and that GPU memory was released.")
        if len(watched) == 1:
            w = watched[0]
            assert w.sup.run is not None
            owner = w.sup.run.owner  # an attached server is someone else's: say whose
            self._confirm(f"Kill run {w.sup.run.run_id} on {w.member.host}?" if owner is None
                          else f"{owner}: kill it?",
                          f"TERM the process group (pid {w.sup.run.pid}), {then}",
                          lambda: self._kill(run))
            return
        hosts = "; ".join(f"{w.member.host}: run {w.sup.run.run_id} (pid {w.sup.run.pid})"
                          for w in watched if w.sup.run is not None)
        self._confirm(f"Kill {run.name} on {len(watched)} hosts?",
                      f"{hosts}. On each: TERM the process group, {then}",
                      lambda: self._kill(run))

    async def _kill(self, run: Run) -> None:
        self.busy.add(id(run))
        try:
            await run.kill(self.kill_grace)
        except SpecconsoleError as exc:
            for w in self._members_of(run):
                self._alert(w, AlertRaised("error", f"KILL FAILED — {exc}"))
        finally:
            self.busy.discard(id(run))
            for w in self._members_of(run):
                self._title(w)

    def action_stacks(self) -> None:
        """py-spy every process of the selected member's run; the pane opens when they come."""
        w = self._selected()
        if w.sup.run is None:
            self.notify("no run to take stacks of")
            return
        self.notify(f"taking the stacks of {w.member.host}'s processes with py-spy…",
                    markup=False)
        self.run_worker(self._stacks(w), exit_on_error=False)

    async def _stacks(self, w: Watch) -> None:
        try:
            taken = await w.sup.stacks()
        except SpecconsoleError as exc:
            self._alert(w, AlertRaised("error", f"STACKS — {exc}"))
            return
        self._show_stacks(w, taken)

    def _show_stacks(self, w: Watch, taken: StacksTaken) -> None:
        when = time.strftime("%H:%M:%S", time.localtime(taken.at))
        self.push_screen(StacksScreen(
            f"stacks of {len(taken.stacks)} processes on {w.member.host} at {when} "
            f"({taken.why}) — saved on the host: {taken.path}", taken.stacks))

    def action_restart(self) -> None:
        """Restart the selected run: every member, through the run."""
        selected = self._selected()
        run = selected.run
        if id(run) in self.busy:
            self.notify("a kill or restart is running")
            return
        what = ", ".join(f"run {w.sup.run.run_id}" for w in self._members_of(run)
                         if w.sup.run is not None) or "nothing running"
        name = selected.sup.profile.key if len(run.members) == 1 else run.name
        self._confirm(f"Restart {name}? ({what})",
                      "Kill the run (TERM, KILL after the grace, sweep, verify), then run "
                      "preflight and launch a new run with a fresh timeline.",
                      lambda: self._restart(run))

    async def _restart(self, run: Run) -> None:
        self.busy.add(id(run))
        try:
            await run.restart(self.kill_grace)
        except PreflightFailed as exc:
            self._refused(run, exc)
        except SpecconsoleError as exc:
            for w in self._members_of(run):
                self._alert(w, AlertRaised("error", f"RESTART FAILED — {exc}"))
        finally:
            self.busy.discard(id(run))
            for w in self._members_of(run):
                self._title(w)

    def action_kill_leftovers(self) -> None:
        run = self._selected().run
        offers = [(w, w.offered) for w in self._members_of(run) if w.offered]
        if not offers or id(run) in self.busy:
            self.notify("a kill or restart is running" if offers else
                        "no leftovers to kill: preflight named none")
            return
        count = sum(len(holders) for _, holders in offers)
        named = "; ".join((f"pid {h.pid} ({h.name}, run {h.run_id}) on GPU {h.gpu}"
                           if isinstance(h, GpuHolder) else
                           f"container {h.name} of run {h.run_id} (stopped, then removed)")
                          + (f" of {w.member.host}" if len(offers) > 1 else "")
                          for w, holders in offers for h in holders)
        hosts = ", ".join(w.member.host for w, _ in offers)
        self._confirm(f"Kill {count} leftover(s) on {hosts}, then launch?",
                      f"{named}. Each is signalled only if it is still the process preflight "
                      f"saw and still holds GPU memory: TERM, KILL after {self.kill_grace:g}s, "
                      "then check it is gone and its GPU memory released; then preflight and "
                      "launch.", lambda: self._kill_leftovers(run, offers))

    async def _kill_leftovers(self, run: Run,
                              offers: list[tuple[Watch, tuple[Leftover, ...]]]) -> None:
        self.busy.add(id(run))
        for w, holders in offers:
            w.offered = ()
            self._alert(w, AlertRaised("killing", "KILLING LEFTOVERS — "
                                       + leftover_words(holders)))
        self.refresh_bindings()
        try:
            for w, holders in offers:
                await w.sup.kill_leftovers(holders, self.kill_grace)
        except PreflightFailed as exc:
            self._refused(run, exc)
            return
        except SpecconsoleError as exc:
            for w, _ in offers:
                self._alert(w, AlertRaised("error", f"KILL FAILED — {exc}"))
            return
        finally:
            self.busy.discard(id(run))
        await self._start(run, launch=True, kill_leftovers=False)

    def _log_pane(self) -> LogPane:
        return self.current.panes.query_one(LogPane)

    def action_toggle_raw(self) -> None:
        self._log_pane().toggle_raw()

    def action_search(self) -> None:
        self.current.panes.show_pane("pane-logs")
        self._log_pane().open_search()

    def action_next_match(self) -> None:
        self._log_pane().step(+1)

    def action_next_cause(self) -> None:
        self.current.panes.show_pane("pane-logs")
        if not self._log_pane().step_cause():
            self.notify("no root cause yet", severity="information")

    def action_prev_match(self) -> None:
        self._log_pane().step(-1)

    def action_toggle_follow(self) -> None:
        self._log_pane().toggle_follow()

    def action_next_pane(self) -> None:
        self._cycle(+1)

    def action_prev_pane(self) -> None:
        self._cycle(-1)

    def _cycle(self, direction: int) -> None:
        if len(self.screen_stack) > 1:  # a confirmation or help is open: tab is theirs
            return
        self.current.panes.cycle(self.focused, direction)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        await self.action_quit_console()

    async def action_quit_console(self) -> None:
        if self.busy:
            self.notify("a kill or restart is running: quit once it has ended",
                        severity="warning")
            return
        watched = [w for w in self.watches if w.sup.run is not None]
        if self.demo and watched:
            message = "demo: stopped the simulated server; nothing is left running"
            for w in watched:
                self._alert(w, AlertRaised("info", "stopping the simulated server before "
                                                   "quitting"))
            for run in dict.fromkeys(w.run for w in watched):
                await self._kill(run)
            self.demo_stopped = all(w.sup.machine.state is State.STOPPED for w in watched)
        else:
            message = self._farewell()
            if any(w.sup.machine.state.live for w in watched):
                await asyncio.sleep(0.3)  # long enough to read that it stays up
        for run in self.runs:
            await run.close()
        restore = restore_command(self.env)
        if restore is not None:
            await run_quietly(restore, self.env)
        self.exit(message)

    def _farewell(self) -> str:
        """A line per server left running (each banner says its own), or that none is."""
        lines = []
        for run, arg in zip(self.runs, self.profile_args, strict=True):
            prefix = f"{run.name}: " if len(self.runs) > 1 else ""
            live = [w for w in self._members_of(run)
                    if w.sup.run is not None and w.sup.machine.state.live]
            for w in live:
                assert w.sup.run is not None
                text = (f"the server keeps running: run {w.sup.run.run_id} on {w.member.host} "
                        f"(pid {w.sup.run.pid}); reattach with `specconsole {arg}`, stop it "
                        f"with `specconsole kill {arg}`")
                self._alert(w, AlertRaised("info", "quitting — " + text))
                lines.append(prefix + text)
            if not live:
                lines.append(f"{prefix}nothing of this profile is running")
        return "\n".join(lines)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key in KEYS:
            yield SystemCommand(key.description, key.help,
                                lambda action=key.action: self.run_action(action))
