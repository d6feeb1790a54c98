"""The fleet: one console over several runs, driven by Pilot on real simulated runs.

Two small (TP 2) simulated profiles, each with its own port, runs directory and fake GPUs, so
their preflights and kills cannot touch each other; a run of two members made of plain
Supervisors checks that kill and restart go to the run, never to a member.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import alive, async_wait_for, carriers, sim_profile, until
from replay import ReplaySupervisor, dead_script, loading_script
from test_app import fake_tmux, tmux_calls
from textual.pilot import Pilot

from tui.cli.status import RunLine, format_lines
from tui.console.app import ConsoleApp
from tui.console.screens.confirm import ConfirmScreen
from tui.console.widgets.banner import Banner
from tui.console.widgets.fleet import FleetTable
from tui.core.explain import explain
from tui.core.fleetview import alert_words, gpu_words, phase_words, worst
from tui.core.gpuview import GpuRow
from tui.core.phases import Phase
from tui.core.profile import load_profile
from tui.core.protocol import GpuInfo, GpuProc
from tui.core.rootcause import RootCause
from tui.core.state import Death, State
from tui.core.status import RunView
from tui.core.timeline import PhaseSpan
from tui.supervise.runs import Member, SingleRun
from tui.supervise.supervisor import RunInfo, Supervisor

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "profiles"


def fleet_profile(tmp: Path, name: str, scenario: str, time_scale: float,
                  target: str = "local") -> Path:
    """tmp/profiles/NAME.toml: a TP 2 simulated profile whose runs and GPUs are its own."""
    home = tmp / name
    home.mkdir()
    text = sim_profile(home, scenario, time_scale=time_scale, name=name, target=target).read_text()
    path = tmp / "profiles" / f"{name}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace("tensor_parallel_size = 8", "tensor_parallel_size = 2")
                    .replace("gpus = 8", "gpus = 2"))
    return path


def cell(app: ConsoleApp, row: str, column: str) -> str:
    return app.query_one(FleetTable).get_cell(row, column).plain


def banner_text(app: ConsoleApp) -> str:
    return str(app.current.panes.query_one(Banner).render())


async def test_a_death_in_the_run_not_open_shows_rings_and_opens_to_its_own_panes(
        tmp_path: Path, cleanup: list[str]) -> None:
    alpha = Supervisor(load_profile(fleet_profile(tmp_path, "alpha", "ready", 300)))
    beta = Supervisor(load_profile(fleet_profile(tmp_path, "beta", "syntax-error", 75)))
    env, record = fake_tmux(tmp_path)
    app = ConsoleApp([SingleRun(alpha), SingleRun(beta)], env=env, kill_grace=1.0)
    bells: list[float] = []
    app.bell = lambda: bells.append(time.time())  # type: ignore[method-assign]
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: alpha.run is not None and beta.run is not None, 20,
                    "both launched")
        cleanup.extend([alpha.run.run_id, beta.run.run_id])
        table = app.query_one(FleetTable)
        assert app.viewing_fleet and table.has_focus
        assert [cell(app, r, "run / host") for r in ("run-0", "member-0", "run-1", "member-1")
                ] == ["alpha", "  └ local", "beta", "  └ local"]
        await until(pilot, lambda: cell(app, "member-0", "state") in ("LOADING", "READY"), 20,
                    "alpha's row loading")
        await pilot.press("down", "enter")  # alpha's host: its panes, while beta dies
        assert not app.viewing_fleet and app.sup is alpha
        await until(pilot, lambda: beta.machine.state is State.DEAD, 40, "beta dies")
        await until(pilot, lambda: cell(app, "member-1", "state") == "DEAD"
                    and cell(app, "run-1", "state") == "DEAD"
                    and "SyntaxError" in cell(app, "member-1", "alert"), 5, "beta's rows DEAD")
        assert cell(app, "member-1", "phase") in {p.label for p in Phase}  # where it died
        await until(pilot, lambda: ["rename-window", "-t", "%3", "✗ DEAD beta@local"]
                    in tmux_calls(record), 5, "the tmux window named after beta's death")
        assert bells, "the bell rang for a run nobody was looking at"
        assert app.sup is alpha and "DEAD" not in banner_text(app)  # alpha's panes: alpha's
        assert not any("SyntaxError" in e.line.plain for e in app.window.view(raw=True))
        await pilot.press("escape")
        assert app.viewing_fleet and table.cursor_row == 1
        await pilot.press("down", "down", "enter")  # beta's host
        assert app.sup is beta
        await until(pilot, lambda: "kimi_k25_patched.py, line 15" in banner_text(app), 5,
                    "beta's banner and root cause")
        assert app.current.panes.query_one(Banner).kind == "dead"
        assert str(app.current.panes.query_one("#title").render()).lstrip().startswith("DEAD")
        view = app.current.panes.log_view
        assert view.cause_offset is not None and view.window is app.window
        data = (Path(beta.run.run_dir) / "server.log").read_bytes()
        held = [e.line for e in app.window.view(raw=True)]
        assert held[0].offset == 0 and len(held) > 20
        for line in held:  # beta's own log, line for line, nothing of alpha's
            assert data[line.offset:].split(b"\n", 1)[0].decode() == line.raw
        await alpha.kill(1.0)


async def test_kill_in_the_fleet_kills_only_the_selected_run(tmp_path: Path,
                                                             cleanup: list[str]) -> None:
    alpha = Supervisor(load_profile(fleet_profile(tmp_path, "alpha", "ready", 300)))
    beta = Supervisor(load_profile(fleet_profile(tmp_path, "beta", "ready", 300)))
    app = ConsoleApp([SingleRun(alpha), SingleRun(beta)], env={}, kill_grace=1.0,
                     profile_arg=["a.toml", "b.toml"])
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: alpha.run is not None and beta.run is not None, 20,
                    "both launched")
        cleanup.extend([alpha.run.run_id, beta.run.run_id])
        await until(pilot, lambda: carriers(alpha.run.run_id) and carriers(beta.run.run_id)
                    and alpha.machine.state is State.LOADING
                    and beta.machine.state is State.LOADING, 20, "both loading")
        await pilot.press("down", "down")  # beta's run row
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        assert beta.run.run_id in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: beta.machine.state is State.STOPPED, 20, "beta STOPPED")
        await until(pilot, lambda: cell(app, "member-1", "state") == "STOPPED", 5, "its row")
        assert carriers(beta.run.run_id) == []
        survivors = carriers(alpha.run.run_id)
        assert survivors and all(alive(pid) for pid in survivors)
        assert alpha.machine.state.live and cell(app, "member-0", "state") != "STOPPED"
        await pilot.press("q")
        await until(pilot, lambda: app.return_value is not None, 30, "quit")
    lines = app.return_value.splitlines()
    assert lines[0].startswith(f"alpha: the server keeps running: run {alpha.run.run_id}")
    assert "`specconsole kill a.toml`" in lines[0]
    assert lines[1] == "beta: nothing of this profile is running"
    assert carriers(alpha.run.run_id), "quitting left alpha running"


class PairRun:
    """A run of two members that only the run itself may start, kill or restart."""

    def __init__(self, head: Supervisor, worker: Supervisor) -> None:
        self.name = "pair"
        self.members = [Member("gpu-a", "head", head), Member("gpu-b", "worker", worker)]
        self.calls: list[str] = []

    async def start(self, *, launch: bool, kill_leftovers: bool, grace: float) -> None:
        self.calls.append("start")

    async def kill(self, grace: float) -> None:
        self.calls.append("kill")

    async def restart(self, grace: float) -> None:
        self.calls.append("restart")

    async def close(self) -> None:
        for member in self.members:
            await member.sup.close()


async def test_a_run_of_several_hosts_is_killed_and_restarted_as_a_whole() -> None:
    sups = [Supervisor(load_profile(PROFILES / name)) for name in ("demo.toml", "demo-crash.toml")]
    for i, sup in enumerate(sups):
        sup.run = RunInfo(f"run-{i}", f"/runs/run-{i}", 100 + i, 0.0, attached=True)

        async def refuse(grace: float = 0.0) -> None:
            raise AssertionError("a member's supervisor was killed directly")
        sup.kill = sup.restart = refuse  # type: ignore[method-assign]
    pair = PairRun(*sups)
    app = ConsoleApp([pair], env={}, kill_grace=1.0)
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: pair.calls == ["start"], 5, "the run started")
        assert [cell(app, r, "role") for r in ("run-0", "member-0", "member-1")] == [
            "2 hosts", "head", "worker"]
        await pilot.press("down", "down")  # the worker's row: the keys act on its whole run
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == "Kill pair on 2 hosts?"
        assert "gpu-a: run run-0 (pid 100)" in app.screen.detail
        await pilot.press("y")
        await until(pilot, lambda: pair.calls[-1] == "kill", 5, "the run's kill")
        await pilot.press("r", "y")
        await until(pilot, lambda: pair.calls[-1] == "restart", 5, "the run's restart")
        await pilot.press("enter")
        assert app.sup is sups[1]
        assert "· worker · run run-1" in str(app.current.panes.query_one("#title").render())
        assert app.check_action("show_fleet", ()) and not app.check_action("open_member", ())
        await pilot.press("escape")
        assert app.viewing_fleet and app.check_action("open_member", ())
        assert not app.check_action("toggle_raw", ())
        await pilot.press("q")
    assert pair.calls == ["start", "kill", "restart"]


SPAN = PhaseSpan(Phase.WEIGHTS, 10.0, progress=0.43, shards=(13, 30))
DEATH = Death(7, "Worker_TP1", 1, None, 50.0, 40.0, Phase.WEIGHTS,
              RootCause("SyntaxError: invalid syntax \x1b]0;x\x07(m.py, line 15)", None, 7, 0))


@pytest.mark.parametrize(("view", "words"), [
    (RunView(State.PENDING), "—"),
    (RunView(State.LOADING, (SPAN,)), "loading weights 43 %"),
    (RunView(State.LOADING, (PhaseSpan(Phase.WEIGHTS, 1.0, shards=(3, 30)),)),
     "loading weights 3/30"),
    (RunView(State.READY, (SPAN,)), "serving"),
    (RunView(State.DEAD, (SPAN,), death=DEATH), "loading weights"),
])
def test_phase_words(view: RunView, words: str) -> None:
    assert phase_words(view) == words


def test_gpu_words_count_the_devices_in_use_and_their_memory() -> None:
    gib = 2**30
    rows = [GpuRow(GpuInfo(i, "H200", used * gib, 141 * gib, 0,
                           (GpuProc(9, used * gib),) if used else ()), (), None, False)
            for i, used in enumerate((120, 121, 0))]
    assert gpu_words(rows) == "2/3 · 241/423G"
    assert gpu_words([]) == "—"


@pytest.mark.parametrize(("kind", "title", "view", "words"), [
    ("dead", "DEAD: Worker_TP1 died\nroot cause: …", RunView(State.DEAD, death=DEATH),
     "SyntaxError: invalid syntax (m.py, line 15)"),
    ("stalled", "STALLED — no log line", RunView(State.STALLED), "STALLED — no log line"),
    ("stalled", "STALLED — no log line", RunView(State.LOADING), ""),
    ("link", "CONNECTION LOST to h", RunView(State.LOADING, link="retry"), "CONNECTION LOST to h"),
    ("link", "CONNECTION LOST to h", RunView(State.LOADING), ""),
    ("error", "x" * 100, RunView(State.PENDING), "x" * 71 + "…"),
])
def test_alert_words(kind: str, title: str, view: RunView, words: str) -> None:
    assert alert_words(kind, title, view) == words


def test_a_run_shows_its_worst_member() -> None:
    assert worst([State.READY, State.DEAD, State.LOADING]) is State.DEAD
    assert worst([State.READY, State.LOADING]) is State.LOADING
    assert worst([State.READY, State.READY]) is State.READY


def test_status_lines_are_aligned_plain_text() -> None:
    lines = format_lines([
        RunLine("alpha", "local", "alpha-1", "alive", "loading weights", "12s"),
        RunLine("b\x1b[2Jeta", "gpu-node-07", "beta-1", "exited (code 1)", "—", "3m00s"),
        RunLine("gamma", "far"),
        RunLine("delta", "gone.example", problem="host unreachable: no route"),
    ])
    assert lines == [
        "alpha local        alpha-1 alive           loading weights 12s",
        "beta  gpu-node-07  beta-1 exited (code 1) —               3m00s",
        "gamma far          no runs",
        "delta gone.example host unreachable: no route",
    ]


def test_fleet_snapshot(snap_compare) -> None:
    loading = ReplaySupervisor(load_profile(PROFILES / "kimi-k25-eagle3.toml"), loading_script())
    dead = ReplaySupervisor(load_profile(PROFILES / "demo-crash.toml"), dead_script())

    async def settle(pilot: Pilot[str]) -> None:
        await pilot.pause(0.5)
        await pilot.wait_for_scheduled_animations()

    app = ConsoleApp([SingleRun(loading), SingleRun(dead)], clock=loading.pinned, env={})
    assert snap_compare(app, terminal_size=(120, 30), run_before=settle)


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def _phase_in_log(run: RunInfo) -> bool:
    """The run's log is far enough into the launch for `status` to name a phase."""
    log = Path(run.run_dir) / "server.log"
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    phase = explain(text, "vllm").last_phase
    return phase is not None and phase >= Phase.CONFIG


async def test_status_lists_every_run_per_host_and_an_unreachable_host(
        tmp_path: Path, cleanup: list[str]) -> None:
    with socket.socket() as probe:  # nobody listens here: that host cannot be reached
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    runs = []
    for name in ("alpha", "beta"):
        sup = Supervisor(load_profile(fleet_profile(tmp_path, name, "ready", 300)))
        try:
            runs.append((name, await sup.launch(skip_preflight=True)))
        finally:
            await sup.close()
        cleanup.append(runs[-1][1].run_id)
    fleet_profile(tmp_path, "far", "ready", 300, target=f"someone@127.0.0.1:{closed}")
    (tmp_path / "ssh_config").write_text("")
    await async_wait_for(lambda: all(_phase_in_log(run) for _, run in runs), 30,
                         "a phase in each run's log")
    result = await asyncio.to_thread(cli, "status", cwd=tmp_path, env={
        "HOME": str(tmp_path), "SPECCONSOLE_SSH_CONFIG": str(tmp_path / "ssh_config")})
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr  # one host unreachable
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    for (name, run), line in zip(runs, lines[:2], strict=True):
        assert line.split()[:4] == [name, "local", run.run_id, "alive"], line
        # the phase it is in (a busy machine may have taken it past the weights already)
        assert any(str(p) in line for p in Phase if p >= Phase.CONFIG), line
    assert lines[2].split()[:2] == ["far", f"someone@127.0.0.1:{closed}"]
    assert f"connection refused by 127.0.0.1 port {closed}" in lines[2]
