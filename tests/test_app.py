"""The console, driven by Pilot on real simulated runs: what the user sees, and the state.

Each test launches the simulated engine (real processes, real signals) under the real
supervisor, locally or through the in-process SSH server, and reads the screen's widgets.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from itertools import pairwise
from pathlib import Path

import pytest
from helpers import carriers, sim_profile, until
from sshserver import SSHTestServer

from tui.console.app import ConsoleApp
from tui.console.screens.confirm import ConfirmScreen
from tui.console.screens.help import HelpScreen
from tui.console.widgets.banner import Banner
from tui.console.widgets.logs import CAUSE_MARK, LogPane, LogView
from tui.console.widgets.procs import ProcPane
from tui.console.widgets.timeline import TimelinePane
from tui.core.profile import HostConfig, load_profile
from tui.core.state import State
from tui.remote.interface import Session
from tui.remote.session import open_session
from tui.supervise.history import History, Launch
from tui.supervise.supervisor import Supervisor


def banner_text(app: ConsoleApp) -> str:
    return str(app.query_one(Banner).render())


def status_text(app: ConsoleApp) -> str:
    return str(app.query_one("#status").render())


def fake_tmux(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment inside 'tmux' whose tmux records its arguments (one JSON list a line)."""
    record = tmp / "tmux-calls.jsonl"
    tmux = tmp / "bin" / "tmux"
    tmux.parent.mkdir()
    tmux.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" >> {record}\nprintf '\\n' >> {record}\n")
    tmux.chmod(tmux.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "TMUX": "/tmp/tmux-0/default,1,0", "TMUX_PANE": "%3",
           "PATH": f"{tmux.parent}:{os.environ['PATH']}"}
    return env, record


def tmux_calls(record: Path) -> list[list[str]]:
    if not record.exists():
        return []
    return [line.strip("\0").split("\0") for line in record.read_text().splitlines() if line]


def first_death(gpu_dir: Path) -> dict[str, float]:
    deaths = [json.loads(line) for line in (gpu_dir / "deaths.jsonl").read_text().splitlines()]
    return min(deaths, key=lambda d: d["time"])


async def test_syntax_error_banner_on_the_worker_death(
        tmp_path: Path, cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "syntax-error", time_scale=75)))
    await _story(tmp_path, sup, cleanup)


async def test_syntax_error_banner_over_ssh(tmp_path: Path, ssh_server: SSHTestServer,
                                            cleanup: list[str]) -> None:
    async def opener(host: HostConfig) -> Session:
        return await open_session(host, ssh_config=ssh_server.ssh_config)

    profile = sim_profile(tmp_path, "syntax-error", target=ssh_server.alias, time_scale=75)
    await _story(tmp_path, Supervisor(load_profile(profile), opener=opener), cleanup)


def _alerting_console(tmp_path: Path, sup: Supervisor
                      ) -> tuple[ConsoleApp, Path, list[float]]:
    """The console inside a fake tmux (its calls recorded), each ring of its bell timed."""
    env, record = fake_tmux(tmp_path)
    app = ConsoleApp(sup, env=env, kill_grace=1.0)
    bells: list[float] = []
    app.bell = lambda: bells.append(time.time())  # type: ignore[method-assign]
    return app, record, bells


async def _story(tmp_path: Path, sup: Supervisor, cleanup: list[str]) -> None:
    """The engineer's night: a worker dies of a SyntaxError; the console says so at once."""
    app, record, bells = _alerting_console(tmp_path, sup)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)
        await until(pilot, lambda: "SyntaxError" in banner_text(app)
                    and "exit code 1" in banner_text(app), what="the DEAD banner, complete")
        banner = app.query_one(Banner)
        assert banner.kind == "dead" and banner.has_class("-dead")
        text = banner_text(app)
        assert "DEAD: Worker_TP" in text and "exit code 1" in text
        assert "kimi_k25_patched.py, line 15" in text
        assert "Engine core initialization failed" not in text
        await until(pilot, lambda: any("DEAD" in " ".join(c) for c in tmux_calls(record)),
                    what="the tmux window renamed")
        calls = tmux_calls(record)
        assert calls[0][:3] == ["rename-window", "-t", "%3"]
        assert [c[0] for c in calls].count("rename-window") == 1  # once per death
        await until(pilot, lambda: any(c[0] == "display-message" and "DEAD" in c[-1]
                                       for c in tmux_calls(record)), 5, "a tmux message")
        # the timeline marks the phase it died in; the status line says it in words
        timeline = str(app.query_one(TimelinePane).render())
        assert "✗" in timeline
        assert status_text(app).startswith("DEAD in ")
        # the root-cause line is marked in the log and the view jumped to it
        view = app.query_one(LogView)
        assert view.cause_offset is not None and not view.following
        await until(pilot, lambda: any(CAUSE_MARK in _drawn(view, y)
                                       for y in range(view.size.height)), 2,
                    "the root-cause line on screen")
        # the dead workers stay in the process pane, marked with their exit code
        await until(pilot, lambda: "DEAD exit 1" in _table_text(app), what="dead rows")
        # the cause and exit code arrived in updates, the later messages above after them
        assert len(bells) == 1, "the terminal bell rang once"
        await pilot.press("q")
        await until(pilot, lambda: app.return_value is not None, what="quit")
    assert "nothing of this profile is running" in app.return_value


def _drawn(view: LogView, y: int) -> str:
    return "".join(segment.text for segment in view.render_line(y))


def _table_text(app: ConsoleApp) -> str:
    table = app.query_one(ProcPane)
    return "\n".join(" ".join(str(c) for c in table.get_row_at(i))
                     for i in range(table.row_count))


async def test_kill_confirms_escalates_and_leaves_no_process(tmp_path: Path,
                                                             cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=300)))
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.machine.state is State.READY, what="READY")
        run_id = sup.run.run_id
        cleanup.append(run_id)
        assert carriers(run_id)
        # the supervisor's state first, then the banner: the bridge's message is a beat later
        await until(pilot, lambda: "READY" in banner_text(app), 5, "the READY banner")
        assert app.query_one(Banner).has_class("-ready")
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # no: nothing happens
        assert not isinstance(app.screen, ConfirmScreen) and carriers(run_id)
        await pilot.press("k", "enter")  # a reflexive Enter does not kill
        assert isinstance(app.screen, ConfirmScreen) and carriers(run_id)
        await pilot.press("y")
        await until(pilot, lambda: sup.machine.state is State.STOPPED, what="STOPPED")
        await until(pilot, lambda: "STOPPED" in banner_text(app), what="the kill report")
        text = banner_text(app)
        assert "no process of the run remains" in text and "GPU memory released" in text
        assert "term" in text.lower()
        assert carriers(run_id) == []
        await pilot.press("q")
    assert app.return_value == "nothing of this profile is running"


async def test_restart_is_a_new_run_with_a_fresh_timeline(tmp_path: Path,
                                                          cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=120)))
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.machine.state is State.LOADING, what="LOADING")
        first = sup.run
        cleanup.append(first.run_id)
        await until(pilot, lambda: len(app.window) > 20, what="log lines")
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: sup.run.run_id != first.run_id and sup.machine.state.live,
                    what="the new run")
        cleanup.append(sup.run.run_id)
        assert carriers(first.run_id) == []
        view = await until(pilot, lambda: (v := app.query_one(TimelinePane).view)
                           is not None and v.launched_at is not None
                           and v.launched_at > first.launched_at and v,
                           what="the new run's timeline")
        assert all(span.start >= view.launched_at for span in view.spans)
        assert run_id_in_title(app) == sup.run.run_id
        # the log pane holds the new run's lines only: it starts again at byte 0
        await until(pilot, lambda: len(app.window) > 0, what="new lines")
        offsets = [e.line.offset for e in app.window.view(raw=True)]
        assert offsets[0] == 0 and offsets == sorted(set(offsets))
        await sup.kill(1.0)


def run_id_in_title(app: ConsoleApp) -> str:
    m = re.search(r"run (\S+)", str(app.query_one("#title").render()))
    return m.group(1) if m else ""


async def test_quit_leaves_the_server_running_and_says_so(tmp_path: Path,
                                                          cleanup: list[str]) -> None:
    profile = load_profile(sim_profile(tmp_path, "ready", time_scale=60))
    sup = Supervisor(profile)
    app = ConsoleApp(sup, profile_arg="myprofile")
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.machine.state is State.LOADING, what="LOADING")
        run_id = sup.run.run_id
        cleanup.append(run_id)
        await pilot.press("q")
        await until(pilot, lambda: "keeps running" in banner_text(app), 5, "the farewell")
    assert "the server keeps running" in app.return_value
    assert run_id in app.return_value and "specconsole myprofile" in app.return_value
    assert carriers(run_id), "the server is still alive after the console quit"
    again = Supervisor(profile)
    try:
        await again.select()
        killed = await again.kill(1.0)
        assert not killed.remaining
    finally:
        await again.close()


@pytest.mark.parametrize("on_ready_timeout", ["keep", "kill"])
async def test_not_ready_within_ready_timeout_alerts_like_a_stall(
        tmp_path: Path, cleanup: list[str], on_ready_timeout: str) -> None:
    path = sim_profile(tmp_path, "ready", time_scale=60)  # a 25-minute load at x60: ~25 s
    path.write_text(path.read_text().replace(
        "[expect]\n", f'[expect]\nready_timeout = "3s"\non_ready_timeout = "{on_ready_timeout}"\n'))
    sup = Supervisor(load_profile(path))
    app, record, bells = _alerting_console(tmp_path, sup)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        run_id = sup.run.run_id
        cleanup.append(run_id)
        await until(pilot, lambda: "not READY after 3.0s (ready_timeout)" in banner_text(app),
                    30, "the TIMEOUT banner")
        banner = app.query_one(Banner)
        assert banner.kind == "timeout" and banner.has_class("-timeout")
        assert banner_text(app).startswith(
            "TIMEOUT — not READY after 3.0s (ready_timeout), still loading"), banner_text(app)
        await until(pilot, lambda: "⚠ not READY after 3.0s (ready_timeout)"
                    in str(app.query_one(TimelinePane).render()), 5, "the timeline says it")
        assert len(bells) == 1, "the terminal bell rang once"
        await until(pilot, lambda: any(c[:3] == ["rename-window", "-t", "%3"]
                                       and "NOT READY" in c[-1] for c in tmux_calls(record)),
                    5, "the tmux window renamed")
        if on_ready_timeout == "keep":
            assert 'the run keeps running (on_ready_timeout = "keep")' in banner_text(app)
            assert sup.machine.state is State.LOADING and carriers(run_id)
        else:  # killed as the kill key kills: nothing of the run remains
            await until(pilot, lambda: sup.machine.state is State.STOPPED, 30, "STOPPED")
            await until(pilot, lambda: "STOPPED" in banner_text(app), 5, "the kill report")
            assert "no process of the run remains" in banner_text(app)
            assert carriers(run_id) == []
        await pilot.press("q")


async def test_attach_to_a_live_run_shows_the_full_log(tmp_path: Path,
                                                       cleanup: list[str]) -> None:
    profile = load_profile(sim_profile(tmp_path, "ready", time_scale=60))
    first = Supervisor(profile)
    await first.launch(skip_preflight=True)
    cleanup.append(first.run.run_id)
    log = Path(first.run.run_dir) / "server.log"
    await first.close()
    deadline = time.monotonic() + 20
    while log.read_bytes().count(b"\n") < 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    sup = Supervisor(profile)
    app = ConsoleApp(sup, launch=False)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="attach")
        assert sup.run.attached and sup.run.run_id == first.run.run_id
        await until(pilot, lambda: len(app.window) >= 60, what="the log replayed")
        await pilot.pause(0.2)
        held = [e.line.offset for e in app.window.view(raw=True)]
        data = log.read_bytes()
        starts = [0, *[i + 1 for i, b in enumerate(data) if b == 10][:-1]]
        assert held[0] == 0
        assert held == starts[:len(held)], "every line from the first, once, in order"
        assert sup.machine.state in (State.LOADING, State.READY)
        assert "attached" not in banner_text(app)  # no false alarm on attach
        await sup.kill(1.0)


async def test_log_keys_search_raw_follow(tmp_path: Path, cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "syntax-error", time_scale=75)))
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.machine.state is State.DEAD, what="DEAD")
        cleanup.append(sup.run.run_id)
        await pilot.pause(0.6)
        pane, view = app.query_one(LogPane), app.query_one(LogView)
        filtered = len(view.window.view(False))
        assert filtered < len(view.window.view(True)), "the noise rules hid something"
        header = str(app.query_one("#log-header").render())
        assert header.startswith("filtered") and "hid " in header
        await pilot.press("f")
        assert view.raw and str(app.query_one("#log-header").render()).startswith("raw")
        await pilot.press("f")
        assert not view.raw
        await pilot.press("slash")
        await pilot.press(*"Traceback|SyntaxError")
        await pilot.press("enter")
        assert pane.match_count >= 2 and view.match_offset is not None
        first = view.match_offset
        shown = view.window.view(False)
        assert re.search("Traceback|SyntaxError", shown[view.window.find(first, False)].line.plain)
        await pilot.press("n")
        assert view.match_offset is not None and view.match_offset != first
        await pilot.press("N")
        assert view.match_offset == first
        await pilot.press("f", "f")  # raw and back: the match is held by offset
        assert view.match_offset == first
        await pilot.press("slash", *"([bad", "enter")  # not a regex: said, search kept
        assert pane.search_text == "Traceback|SyntaxError"
        await pilot.press("escape")  # closes the search box, back to the lines
        assert not app.query_one("#log-search").display and view.has_focus
        await pilot.press("space")
        assert view.following
        await pilot.press("space")
        assert not view.following
        await pilot.press("q")


async def test_small_terminal_collapses_panes_to_tabs(tmp_path: Path,
                                                      cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=60)))
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)
        shown = [p.id for p in app.query(".pane") if p.display]
        assert shown == ["pane-logs"] and app.query_one("#tabs").display
        await pilot.press("tab")
        assert [p.id for p in app.query(".pane") if p.display] == ["pane-gpus"]
        await pilot.press("tab", "tab")
        assert [p.id for p in app.query(".pane") if p.display] == ["pane-timeline"]
        await pilot.press("shift+tab")
        assert [p.id for p in app.query(".pane") if p.display] == ["pane-procs"]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.resize_terminal(200, 50)
        await until(pilot, lambda: len([p for p in app.query(".pane") if p.display]) == 4,
                    what="the four panes back")
        await sup.kill(1.0)


@pytest.mark.parametrize(("scenario", "kind", "words"), [
    ("oom", "dead", ["OutOfMemoryError", "CUDA out of memory"]),
    ("engine-killed", "dead", ["EngineCore_DP0", "while serving"]),
    ("hang", "stalled", ["STALLED", "no log line for"]),
])
async def test_each_demo_scenario_ends_on_its_banner(tmp_path: Path, cleanup: list[str],
                                                     scenario: str, kind: str,
                                                     words: list[str]) -> None:
    profile = sim_profile(tmp_path, scenario, time_scale=300, stall="2s")
    sup = Supervisor(load_profile(profile))
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)
        await until(pilot, lambda: app.query_one(Banner).kind == kind
                    and all(w in banner_text(app) for w in words), 60, f"the {kind} banner")
        assert app.query_one(Banner).has_class(f"-{kind}")
        await sup.kill(1.0)


async def test_demo_quit_stops_the_simulated_server(tmp_path: Path, cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=60)))
    app = ConsoleApp(sup, demo=True, kill_grace=1.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.machine.state is State.LOADING, what="LOADING")
        run_id = sup.run.run_id
        cleanup.append(run_id)
        assert "simulated engine" in str(app.query_one("#title").render())
        await pilot.press("q")
        await until(pilot, lambda: app.return_value is not None, 20, "quit")
    assert app.demo_stopped and "nothing is left running" in app.return_value
    assert carriers(run_id) == []


async def test_scrolling_past_the_capped_buffer_fetches_older_lines(
        tmp_path: Path, cleanup: list[str]) -> None:
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=300)))
    app = ConsoleApp(sup, kill_grace=1.0, log_cap=40)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.machine.state is State.READY, what="READY")
        cleanup.append(sup.run.run_id)
        view = app.query_one(LogView)
        await until(pilot, lambda: view.window.start > 0, what="lines beyond the cap")
        assert len(view.window) == 40  # bounded, however long the log
        first_held = view.window.start
        view.focus()
        await pilot.press("home")
        await until(pilot, lambda: view.window.start < first_held, 10, "an older page")
        assert len(view.window) == 40 and view.window.detached
        held = [e.line for e in view.window.view(raw=True)]
        data = (Path(sup.run.run_dir) / "server.log").read_bytes()
        for line in held:  # each fetched line is the file's text at its byte offset
            assert data[line.offset:].split(b"\n", 1)[0].decode() == line.raw
        assert "scrolled back" in str(app.query_one("#log-header").render())
        await pilot.press("space")  # follow again: back at the live end, no line missing
        await until(pilot, lambda: not view.window.detached, 10, "re-anchored")
        held = await until(pilot, lambda: (h := list(view.window.view(True))) and len(h) == 40
                           and h[-1].end == sup.log_end and h, what="the live end")
        assert all(a.end == b.line.offset for a, b in pairwise(held))
        await sup.kill(1.0)


async def test_preflight_refusal_is_on_screen_and_nothing_launches(tmp_path: Path) -> None:
    profile = load_profile(sim_profile(tmp_path, "ready"))
    with socket.socket() as busy:  # the port is taken: preflight must refuse
        busy.bind(("127.0.0.1", profile.server.port))
        busy.listen()
        sup = Supervisor(profile)
        app = ConsoleApp(sup)
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, lambda: "PREFLIGHT REFUSED" in banner_text(app), 20,
                        "the refusal")
            assert app.query_one(Banner).kind == "error"
            assert str(profile.server.port) in banner_text(app)
            timeline = str(app.query_one(TimelinePane).render())
            assert "preflight" in timeline and "✗" in timeline
            assert sup.run is None
            await pilot.pause(1.2)  # a clock tick must not turn the status back to "connecting"
            assert status_text(app).startswith("preflight refused the launch")
            await pilot.press("q")
        assert app.return_value == "nothing of this profile is running"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


async def test_history_eta_smoke_and_spec_decoding_on_screen(tmp_path: Path,
                                                             cleanup: list[str]) -> None:
    profile = load_profile(sim_profile(tmp_path, "ready", time_scale=300,
                                       extra="[smoke]\nenabled = true\n"))
    history = History(tmp_path / "h.sqlite3")
    history.record(Launch("ready-earlier", profile.key, profile.host.target, time.time() - 3600,
                          "ready", took=1500.0,
                          phases=(("reading config", 1.0, 300.0), ("loading weights", 301.0,
                                                                   900.0))))
    sup = Supervisor(profile, history=history)
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)
        timeline = app.query_one(TimelinePane)
        await until(pilot, lambda: "last launch" in str(timeline.render()), 10, "last launch")
        assert "READY in 25m00s" in str(timeline.render())
        await until(pilot, lambda: "usually 5m00s" in str(timeline.render()), 20, "usual")
        await until(pilot, lambda: "smoke request answered" in banner_text(app), 30, "smoke")
        assert "“Hello" in banner_text(app)
        await until(pilot, lambda: "speculative decoding" in str(timeline.render())
                    and "pos 4" in str(timeline.render()), 30, "the spec-decode readout")
        await until(pilot, lambda: "/metrics:" in str(timeline.render()), 30, "the counters")
        await sup.kill(1.0)
    assert history.get(sup.run.run_id).outcome == "ready"
