"""Keys as data, the palette, alerts outside the window, the default command and the picker."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from helpers import until
from rich.console import Console
from rich.style import Style

from tui.cli import main as cli
from tui.console.alerts import restore_command, title_sequence, window_name_command
from tui.console.app import ConsoleApp
from tui.console.keys import KEYS, bindings
from tui.console.screens.help import HelpScreen
from tui.console.screens.picker import PickerApp
from tui.core.gpuview import GpuRow
from tui.core.profile import load_profile
from tui.core.protocol import GpuInfo
from tui.supervise.supervisor import Supervisor

PROFILES = Path(__file__).parent.parent / "profiles"
REQUIRED = {"r": "restart", "k": "kill", "f": "toggle_raw", "slash": "search",
            "n": "next_match", "N": "prev_match", "space": "toggle_follow",
            "tab": "next_pane", "question_mark": "help", "q": "quit_console"}


def test_every_required_key_is_declared_once_with_an_id_and_help() -> None:
    declared = {k.key: k.action for k in KEYS}
    assert declared.items() >= REQUIRED.items()
    ids = [k.id for k in KEYS]
    assert len(ids) == len(set(ids)) and all(k.help for k in KEYS)
    assert [b.id for b in bindings()] == ids
    app = ConsoleApp(Supervisor(load_profile(PROFILES / "demo.toml")))
    for key in KEYS:  # each action exists on the app
        assert callable(getattr(app, f"action_{key.action}"))


async def test_help_and_palette_list_every_key() -> None:
    app = ConsoleApp(Supervisor(load_profile(PROFILES / "demo.toml")), launch=False)
    async with app.run_test(size=(120, 40)) as pilot:
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {k.description for k in KEYS} <= titles
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        console = Console(record=True, width=200, file=io.StringIO())
        console.print(app.screen.table)
        text = console.export_text()
        for key in KEYS:
            assert key.help in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await app.sup.close()


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"TMUX": "/tmp/tmux-0/default,1,0"}, ["tmux", "rename-window", "✗ DEAD p"]),
    ({"TMUX": "x", "TMUX_PANE": "%7"}, ["tmux", "rename-window", "-t", "%7", "✗ DEAD p"]),
])
def test_tmux_window_is_named_only_inside_tmux(env: dict[str, str],
                                               expected: list[str] | None) -> None:
    assert window_name_command("✗ DEAD p", env) == expected
    assert (restore_command(env) is None) == (expected is None)


def test_terminal_title_carries_no_remote_escape() -> None:
    seq = title_sequence("DEAD \x1b]52;c;ZXZpbA==\x07 \x1b[2J worker")
    assert seq.startswith("\x1b]2;") and seq.endswith("\x07")
    assert "\x1b" not in seq[4:-1] and "\x07" not in seq[4:-1] and "DEAD" in seq


@pytest.mark.parametrize(("argv", "expected"), [
    ([], ["console"]),
    (["kimi-k25-eagle3"], ["console", "kimi-k25-eagle3"]),
    (["profiles/demo.toml", "--no-launch"], ["console", "profiles/demo.toml", "--no-launch"]),
    (["demo", "--scenario", "oom"], ["demo", "--scenario", "oom"]),
    (["wait", "x"], ["wait", "x"]),
    (["--help"], ["--help"]),
])
def test_a_profile_alone_opens_the_console(argv: list[str], expected: list[str]) -> None:
    assert cli._with_default_command(argv, set(cli.COMMANDS)) == expected


def test_commands_list_matches_the_parser() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(cli.COMMANDS)


async def test_picker_lists_profiles_and_returns_the_chosen_one(tmp_path: Path) -> None:
    profiles = [tmp_path / "a.toml", tmp_path / "b.toml"]
    app = PickerApp(profiles)
    async with app.run_test() as pilot:
        await pilot.press("down", "enter")
    assert app.return_value == profiles[1]
    empty = PickerApp([])
    async with empty.run_test() as pilot:
        assert "No profiles" in str(empty.query_one("#picker-empty").render())
        await pilot.press("q")
    assert empty.return_value is None


def test_list_profiles_finds_the_shipped_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROFILES.parent)
    stems = [p.stem for p in cli.list_profiles()]
    assert {"demo", "demo-crash", "kimi-k25-eagle3"} <= set(stems)
    assert stems == sorted(stems)


def test_log_lines_keep_vllm_colours_and_nothing_else() -> None:
    from tui.console.widgets.logs import LogView
    from tui.core.logline import parse_line
    from tui.core.logwindow import Entry, LogWindow

    raw = ("\x1b[1;36m(Worker_TP0 pid=3011)\x1b[0;0m INFO 09-30 14:02:41 [x.py:1] hello"
           "\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[H")
    view = LogView(LogWindow())
    compact = view.line_text(Entry.of(parse_line(raw, 0), None), current=False)
    assert compact.plain == "14:02:41 TP0    · hello"  # the filtered view's compact form
    view.raw = True  # as written, in vLLM's own colours
    text = view.line_text(Entry.of(parse_line(raw, 0), None), current=False)
    assert text.plain == parse_line(raw, 0).plain
    assert "\x1b" not in text.plain and "pwned" not in text.plain
    prefix = next(span for span in text.spans if span.start == 0)
    assert prefix.end == len("(Worker_TP0 pid=3011)")
    assert Style.parse(str(prefix.style)).color.number == 6  # vLLM's cyan prefix survives


def test_host_text_is_cleaned_before_it_can_reach_the_screen() -> None:
    from tui.core.protocol import decode

    fault = decode(json.dumps({"v": 1, "t": "error", "kind": "nvml",
                               "message": "bad \x1b]52;c;ZXZpbA==\x07\x1b[2Jthing"}))
    assert fault.message == "bad thing"
    procs = decode(json.dumps({"v": 1, "t": "procs", "time": 1.0, "procs": [
        {"pid": 1, "name": "x\x1b]0;title\x07", "cmd": "c\x1b[H"}]}))
    assert (procs.procs[0].name, procs.procs[0].cmd) == ("x", "c")
    log = decode(json.dumps({"v": 1, "t": "log", "off": 0, "end": 9, "lines": ["\x1b[31mred"]}))
    assert log.lines == ("\x1b[31mred",)  # kept as written: colours and offsets stay true
    hello = decode(json.dumps({"v": 1, "t": "hello", "redact": ["sec\x1bret"], "time": 0}))
    assert hello.redact == ("sec\x1bret",)  # a secret is matched as it is, never altered


async def test_banner_and_log_lines_draw_no_escape_or_tab() -> None:
    from textual.app import App

    from tui.console.widgets.banner import Banner
    from tui.console.widgets.logs import LogView
    from tui.core.logline import parse_line
    from tui.core.logwindow import Entry, LogWindow

    class Probe(App[None]):
        def compose(self):
            yield Banner()

    app = Probe()
    async with app.run_test():
        banner = app.query_one(Banner)
        banner.show("error", "agent: \x1b]52;c;ZXZpbA==\x07boom\x1b[2J", "why\x1b]0;t\x07 here")
        assert str(banner.render()) == "agent: boom\nwhy here"
    line = parse_line("\x1b[1;36m(Worker_TP0 pid=1)\x1b[0;0m a\tb", 0)
    view = LogView(LogWindow())
    compact = view.line_text(Entry.of(line, None), current=False)
    assert compact.plain == "         TP0      a       b"  # the message's own tab stops
    view.raw = True
    text = view.line_text(Entry.of(line, None), current=False)
    assert text.plain == "(Worker_TP0 pid=1) a    b"  # to the next tab stop, as a terminal


def test_a_failed_smoke_request_is_up_but_not_serving() -> None:
    from tui.console.bridge import Bridge
    from tui.console.messages import AlertRaised
    from tui.supervise.supervisor import SmokeDone

    bridge = Bridge(Supervisor(load_profile(PROFILES / "demo.toml")))
    bridge.ready_took = 1490.0
    failed = bridge.translate([SmokeDone(False, 0.1, None, "", "HTTP 500: EngineCore …")], 0.0)
    alert = next(m for m in failed if isinstance(m, AlertRaised))
    assert alert.kind == "warning" and alert.title.startswith("UP BUT NOT SERVING (took 24m50s)")
    assert "HTTP 500" in alert.detail and not alert.ring
    served = bridge.translate([SmokeDone(True, 0.42, 16, "Hello there.")], 0.0)
    alert = next(m for m in served if isinstance(m, AlertRaised))
    assert alert.kind == "ready" and "answered in 0.42s, 16 tokens" in alert.title
    assert alert.detail == "“Hello there.”"


@pytest.mark.parametrize(("nvml_ok", "error", "shown"), [
    (False, "no NVML on this host (libnvidia-ml.so.1 not found)",
     "no NVML on this host (libnvidia-ml.so.1 not found): no GPU data will come"),
    (True, None, "no GPU data yet"),
])
def test_the_gpu_pane_tells_no_nvml_from_no_data_yet(nvml_ok: bool, error: str | None,
                                                    shown: str) -> None:
    """A host whose agent said it has no NVML (a CPU build, no driver) says so and that no
    data will come; a host with NVML whose first sample has not arrived says "yet"."""
    from tui.console.bridge import Bridge
    from tui.console.messages import GpusChanged
    from tui.console.widgets.gpus import GpuPane
    from tui.core.protocol import Hello
    from tui.supervise.supervisor import AgentHello

    bridge = Bridge(Supervisor(load_profile(PROFILES / "demo.toml")))
    hello = Hello("1", "3.11", "5.9", "12.0" if nvml_ok else None, nvml_ok, error,
                  8 if nvml_ok else 0, "gpu-a", True, 0.0)
    changed = next(m for m in bridge.translate([AgentHello(hello)], 0.0)
                   if isinstance(m, GpusChanged))
    pane = GpuPane()
    pane.on_gpus_changed(changed)
    text = pane.render()
    assert changed.rows == ()
    assert text.plain.startswith(shown)
    assert ("no GPU data will come" in text.plain) is (not nvml_ok)


def _gpu_rows(holder: int | None, lagging: bool = False) -> tuple[GpuRow, ...]:
    return tuple(GpuRow(GpuInfo(i, "NVIDIA H200 (simulated)", 0, 141 << 30, 0), (), holder,
                        lagging) for i in range(8))


@pytest.mark.parametrize(("width", "holder", "lagging", "expected"), [
    # 160 columns leave the GPU pane 60: the name whole, the bar and the sparkline share the rest
    (60, None, False, (16, 12, 7)),
    (60, 23597, False, (16, 7, 4)),
    (60, 23597, True, (13, 8, 0)),  # a lagging mark takes 7: the name gives way to the bar
    (96, 23597, False, (16, 28, 19)),
    (40, 23597, False, (10, 8, 0)),  # narrow: name 10, bar 8, no sparkline; the rest cropped
])
def test_the_gpu_rows_show_the_device_name_whole_where_the_row_has_room(
        width: int, holder: int | None, lagging: bool, expected: tuple[int, int, int]) -> None:
    from tui.console.widgets.gpus import row_columns

    rows = _gpu_rows(holder, lagging)
    names = [r.info.name.removeprefix("NVIDIA ") for r in rows]
    name_w, bar_w, spark_w = row_columns(rows, names, width)
    assert (name_w, bar_w, spark_w) == expected
    tail = len(f" pid {holder}" if holder else " —") + (7 if lagging else 0)
    drawn = 2 + name_w + 1 + bar_w + 15 + 4 + (1 + spark_w if spark_w else 0) + tail
    assert width < 60 or drawn <= width


# what a host may say, once the session has cleaned it: markup-like words (a closing tag with no
# opening one is a MarkupError when parsed as markup)
REMOTE = "[bold]boom[/bold] [/] [link=x]"


async def test_remote_words_are_drawn_as_text_never_as_markup() -> None:
    from textual.widgets._toast import Toast

    from tui.console.screens.stacks import StacksScreen
    from tui.console.widgets.procs import ProcPane
    from tui.core.errors import SessionError
    from tui.core.proctree import ProcRow
    from tui.supervise.supervisor import StacksTaken

    app = ConsoleApp(Supervisor(load_profile(PROFILES / "demo.toml")), launch=False)
    async with app.run_test(size=(200, 40), notifications=True) as pilot:
        w = app.watches[0]
        await until(pilot, lambda: w.idle_text, 10, "the console idle (nothing launched)")

        async def unreadable(start: int, end: int) -> list[object]:
            raise SessionError("gpu1", REMOTE)

        w.sup.read_log = unreadable  # type: ignore[method-assign]
        await app._older(w, 4096)  # its notice quotes the host's words
        await until(pilot, lambda: app.screen.query(Toast), 10, "the notice drawn")
        toasts = [str(t.render()) for t in app.screen.query(Toast)]
        assert any(f"older lines could not be read: gpu1: {REMOTE}" in t for t in toasts), toasts
        app._idle(w, f"agent failed: {REMOTE}")  # the status line quotes why nothing runs
        w.panes.query_one(ProcPane).show((ProcRow(0, 7, f"python {REMOTE}", "running", 1.0,
                                                  1 << 20, None, 0.0, True, None),), 1.0)
        await pilot.pause()
        assert str(w.panes.query_one("#status").render()) == f"agent failed: {REMOTE}"
        assert w.panes.query_one(ProcPane).get_cell_at((0, 1)).plain == f"python {REMOTE}"
        run_dir = "/home/u/runs [x]/demo-[1]"  # a run path with brackets
        app._show_stacks(w, StacksTaken((), f"{run_dir}/stacks.txt", "on request", 0.0))
        await until(pilot, lambda: isinstance(app.screen, StacksScreen), 10, "the stacks pane")
        await pilot.pause()
        assert f"saved on the host: {run_dir}/stacks.txt" in str(
            app.screen.query_one("#stacks-title").render())
        await app.sup.close()


def test_process_pane_pid_cell_carries_the_container_pid_and_keeps_the_table_width() -> None:
    from tui.console.widgets.procs import COLUMNS, pid_cell, widths
    from tui.core.proctree import ProcRow

    def row(pid: int, cpid: int | None) -> ProcRow:
        return ProcRow(0, pid, "Worker_TP0", "running", None, None, None, 0.0, True, None,
                       cpid=cpid)

    assert pid_cell(row(28566, None)) == "28566"  # a bare run's pane is as before
    assert pid_cell(row(28566, 10)) == "28566 (10)"
    assert widths(7) == COLUMNS
    wide = widths(len("1234567 (123)"))
    assert wide[0] == ("pid", 13) and wide[1] == ("process", 13)
    assert sum(w for _, w in wide) == sum(w for _, w in COLUMNS)
    assert widths(40)[1] == ("process", 13)  # never narrower than NAME_MIN


async def test_process_pane_widens_its_pid_column_for_container_pids() -> None:
    from tui.console.widgets.procs import ProcPane
    from tui.core.proctree import ProcRow

    app = ConsoleApp(Supervisor(load_profile(PROFILES / "demo.toml")), launch=False)
    async with app.run_test(size=(80, 24)) as pilot:
        w = app.watches[0]
        await until(pilot, lambda: w.idle_text, 10, "the console idle (nothing launched)")
        pane = w.panes.query_one(ProcPane)
        pane.show((ProcRow(0, 28566, "Worker_TP0", "running", 1.0, 1 << 20, None, 0.0, True,
                           None, cpid=10),), 1.0)
        await pilot.pause()
        assert pane.get_cell_at((0, 0)) == "28566 (10)"
        assert [c.width for c in pane.columns.values()][:2] == [10, 16]
        await app.sup.close()


def test_a_job_nearing_its_time_limit_rings_like_a_death() -> None:
    """The time-left alert is a transition: the bell and tmux (ring), the banner, the fleet."""
    from tui.console.app import FLEET_ALERTS, WINDOW_MARKS
    from tui.console.bridge import Bridge
    from tui.console.messages import AlertRaised
    from tui.console.widgets.banner import KINDS
    from tui.supervise.events import JobEnding

    bridge = Bridge(Supervisor(load_profile(PROFILES / "demo.toml")))
    alert = next(m for m in bridge.translate([JobEnding("494583", 600.0)], 0.0)
                 if isinstance(m, AlertRaised))
    assert (alert.kind, alert.ring) == ("ending", True)
    assert alert.title == ("TIME LIMIT NEAR — job 494583 has 10 min left before its time limit "
                           "ends it")
    assert alert.kind in WINDOW_MARKS and alert.kind in FLEET_ALERTS and alert.kind in KINDS
