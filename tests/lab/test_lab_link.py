"""Network faults mid-load, through the real sshd: the link, a partition under loss and delay,
sshd killed, a worker dying while the link is down; directly and through the jump host.

Each test launches one simulated load (about 30 s) with `specconsole wait --launch` (a
subprocess, as a user runs it) and watches the same run in the console (Textual Pilot, attached
in-process); keepalive 1 s x 3. Both must say "connection lost, retrying" within 5 s of the
fault, reconnect with capped backoff, and go on from the last byte offset: the console shows
every line of the log exactly once (byte offsets and the simulator's per-process [sim#n]
numbers), and the server never notices (same run, same pid, READY). The times are figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import carriers, count_lines
from textual.pilot import Pilot

from lab.netlab import Lab
from tui.console.app import ConsoleApp
from tui.core.profile import load_profile
from tui.core.state import State
from tui.supervise.supervisor import BACKOFF_MAX_S, LinkLost, LinkRestored, Supervisor

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
SHOW_LOST_S = 5.0  # fault -> "connection lost, retrying" on both screens
OUTAGE_S = 10.0
FAULT_AT_S = 8.0  # after the launch: mid-load (the load takes about 30 s)
LOAD_TIMEOUT_S = 120.0
LOST_TEXT = "connection lost, retrying"
# the load's phases without a fault; `wait` ends at READY, which may come before it printed the
# last ones (the health endpoint and the API server's lines race)
LOAD_PHASES = ["launching", "reading config", "loading weights", "loading drafter", "compiling",
               "allocating KV cache", "capturing CUDA graphs", "starting API server",
               "application started", "serving"]
BEFORE_READY = LOAD_PHASES.index("capturing CUDA graphs") + 1


@dataclass(frozen=True)
class Route:
    """Which host runs the server, whose link breaks, whose sshd dies."""

    host: str
    link_host: str
    sshd_host: str


ROUTES = {"direct": Route("gpu-a", "gpu-a", "gpu-a"),
          "jump": Route("gpu-b", "gpu-a", "gpu-b")}


@dataclass
class Watch:
    """`specconsole wait` (a subprocess) and the console (Pilot) on one run."""

    app: ConsoleApp
    pilot: Pilot[str]
    cli: asyncio.subprocess.Process
    launched_at: float
    run_id: str
    pid: int
    cli_lines: list[tuple[float, str]] = field(default_factory=list)
    link_events: list[tuple[float, Any]] = field(default_factory=list)
    lost: tuple[float, float] = (0.0, 0.0)  # fault -> "connection lost" shown: wait, console

    @property
    def sup(self) -> Supervisor:
        return self.app.sup

    def status(self) -> str:
        return str(self.app.query_one("#status").render())

    def cli_said(self, text: str, after: float = 0.0) -> float | None:
        """When the CLI first printed a line containing `text` at or after `after`."""
        return next((t for t, line in self.cli_lines if t >= after and text in line), None)

    async def until(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := check()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n"
                                     + self.cli_text())
            await self.pilot.pause(0.05)
        return value

    async def sleep_until(self, at: float) -> None:
        """Keep the console running until `at` seconds after the launch."""
        while time.monotonic() < self.launched_at + at:
            await self.pilot.pause(0.05)

    def cli_text(self) -> str:
        return "\n".join(line for _, line in self.cli_lines)

    async def outage(self, fault: Callable[[], None], heal: Callable[[], None],
                     hold: float = OUTAGE_S) -> tuple[float, float]:
        """Break, check both screens say so in time, heal after `hold`; the moments."""
        await self.sleep_until(FAULT_AT_S)
        faulted = time.monotonic()
        fault()
        console_lost = await self.until(
            lambda: LOST_TEXT in self.status() and any(
                t >= faulted and isinstance(e, LinkLost) for t, e in self.link_events)
            and time.monotonic(), SHOW_LOST_S * 3, "the console to say the link is lost")
        await self.until(lambda: self.cli_said(LOST_TEXT, faulted), SHOW_LOST_S * 3,
                         "`wait` to say the link is lost")
        self.lost = (self.cli_said(LOST_TEXT, faulted) - faulted, console_lost - faulted)
        while time.monotonic() < faulted + hold:
            await self.pilot.pause(0.05)
        healed = time.monotonic()
        heal()
        return faulted, healed


@contextlib.asynccontextmanager
async def watching(profile: Path, tmp_path: Path) -> AsyncIterator[Watch]:
    """Launch with `specconsole wait --launch`, attach the console, yield both; the CLI's
    output is collected as it comes."""
    launched_at = time.monotonic()
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui", "wait", str(profile), "--launch", "--timeout",
        f"{LOAD_TIMEOUT_S:g}s", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
    lines: list[tuple[float, str]] = []

    async def read() -> None:
        assert cli.stdout is not None
        while raw := await cli.stdout.readline():
            lines.append((time.monotonic(), raw.decode().rstrip("\n")))

    reader = asyncio.create_task(read())
    try:
        deadline = time.monotonic() + 30
        while not (first := next((ln for _, ln in lines if "launched run" in ln), None)):
            assert time.monotonic() < deadline and cli.returncode is None, \
                "\n".join(ln for _, ln in lines)
            await asyncio.sleep(0.05)
        found = re.search(r"launched run (\S+) on .* \(pid (\d+)\)", first)
        assert found, first
        sup = Supervisor(load_profile(profile))
        events = sup.subscribe()
        app = ConsoleApp(sup, launch=False, kill_grace=2.0,
                         env={k: v for k, v in os.environ.items() if not k.startswith("TMUX")})
        async with app.run_test(size=(160, 45)) as pilot:
            watch = Watch(app, pilot, cli, launched_at, found[1], int(found[2]), lines)

            async def links() -> None:
                while True:
                    event = await events.get()
                    if isinstance(event, (LinkLost, LinkRestored)):
                        watch.link_events.append((time.monotonic(), event))

            link_task = asyncio.create_task(links())
            try:
                await watch.until(lambda: sup.run is not None and sup.run.run_id == watch.run_id,
                                  15, "the console to attach to the run `wait` launched")
                yield watch
            finally:
                link_task.cancel()
    finally:
        if cli.returncode is None:
            cli.kill()
        await cli.wait()
        reader.cancel()


def phases_right(seen: list[str]) -> bool:
    """Every phase up to the graphs, in order; then API server phases in order (a phase that
    began at the same moment as the next may be folded into it)."""
    rest = iter(LOAD_PHASES[BEFORE_READY:])
    return (seen[:BEFORE_READY] == LOAD_PHASES[:BEFORE_READY]
            and all(p in rest for p in seen[BEFORE_READY:]))


def phases(cli_output: str) -> list[str]:
    return [line.split("phase: ", 1)[1].split(" (at")[0] for line in cli_output.splitlines()
            if "phase: " in line]


async def finish_ready(w: Watch, healed: float, name: str, figures: dict[str, Any],
                       runs: Path) -> None:
    """After the heal: both reconnect, both reach READY on the same run, every line once."""
    restored = await w.until(lambda: w.cli_said("connection restored", healed),
                             LOAD_TIMEOUT_S, "`wait` to reconnect")
    console_restored = await w.until(
        lambda: next((t for t, e in w.link_events if isinstance(e, LinkRestored) and t >= healed),
                     None), LOAD_TIMEOUT_S, "the console to reconnect")
    await w.until(lambda: LOST_TEXT not in w.status(), 10, "the console's link line to clear")
    await w.until(lambda: w.sup.machine.state is State.READY, LOAD_TIMEOUT_S,
                  "the console to reach READY")
    code = await asyncio.wait_for(w.cli.wait(), LOAD_TIMEOUT_S)
    await asyncio.sleep(0.2)  # the reader takes the last lines
    out = w.cli_text()
    assert code == 0, out
    assert "READY after" in out
    # capped backoff: retries wait longer each time, never past the cap, reset on reconnect
    waits = [e.retry_in for _, e in w.link_events if isinstance(e, LinkLost)]
    assert waits and waits == sorted(waits) and max(waits) <= BACKOFF_MAX_S, waits
    # the server never noticed: one run, the pid `wait` launched still serving it
    assert [p.name for p in runs.iterdir()] == [w.run_id]
    assert w.pid in carriers(w.run_id) and w.sup.run.pid == w.pid
    # phases the same on both screens, and the whole load's
    assert phases_right(phases(out)), out
    labels = [s.phase.label for s in w.sup.machine.timeline.spans]
    assert phases_right(labels), labels
    # every line exactly once on the console
    window = w.app.window
    assert window.evicted == {True: 0, False: 0}
    count = count_lines([e.line for e in window.view(raw=True)],
                        Path(w.sup.run.run_dir) / "server.log")
    assert count.processes >= 8 and count.seq_faults == [], count.seq_faults
    assert count.stray == 0 and not count.out_of_order
    assert (count.lost, count.duplicated) == (0, 0), count
    figures[name] = {
        "fault_to_lost_shown_s": {"wait": round(w.lost[0], 2), "console": round(w.lost[1], 2)},
        "heal_to_reconnected_s": {"wait": round(restored - healed, 2),
                                  "console": round(console_restored - healed, 2)},
        "lines_lost": count.lost, "lines_duplicated": count.duplicated,
        "lines_shown": count.shown, "retries": len(waits)}


def _check_lost_in_time(w: Watch) -> None:
    cli_s, console_s = w.lost
    assert cli_s < SHOW_LOST_S and console_s < SHOW_LOST_S, w.lost


@pytest.mark.parametrize("route", ROUTES)
async def test_link_down_mid_load(route: str, lab: Lab, lab_profile: Callable[..., Path],
                                  tmp_path: Path, cleanup: list[str],
                                  lab_figures: dict[str, Any]) -> None:
    r = ROUTES[route]
    async with watching(lab_profile(r.host), tmp_path) as w:
        cleanup.append(w.run_id)
        _, healed = await w.outage(lambda: lab.link_down(r.link_host),
                                   lambda: lab.link_up(r.link_host))
        _check_lost_in_time(w)
        await finish_ready(w, healed, f"link down 10 s ({route})", lab_figures,
                           tmp_path / "runs")


@pytest.mark.parametrize("route", ROUTES)
async def test_partition_under_loss_and_delay(route: str, lab: Lab,
                                              lab_profile: Callable[..., Path], tmp_path: Path,
                                              cleanup: list[str],
                                              lab_figures: dict[str, Any]) -> None:
    """5 % loss and +100 ms each way for the whole load, and a 10 s partition in it."""
    r = ROUTES[route]
    lab.delay(r.link_host, 100)
    lab.loss(r.link_host, 5)
    async with watching(lab_profile(r.host, delayed=True), tmp_path) as w:
        cleanup.append(w.run_id)
        _, healed = await w.outage(lambda: lab.partition(r.link_host),
                                   lambda: lab.heal(r.link_host))
        _check_lost_in_time(w)
        await finish_ready(w, healed, f"partition 10 s, 5 % loss, +100 ms ({route})",
                           lab_figures, tmp_path / "runs")


@pytest.mark.parametrize("route", ROUTES)
async def test_sshd_killed_and_restarted(route: str, lab: Lab, lab_profile: Callable[..., Path],
                                         tmp_path: Path, cleanup: list[str],
                                         lab_figures: dict[str, Any]) -> None:
    r = ROUTES[route]
    async with watching(lab_profile(r.host), tmp_path) as w:
        cleanup.append(w.run_id)
        _, healed = await w.outage(lambda: lab.kill_sshd(r.sshd_host),
                                   lambda: lab.start_sshd(r.sshd_host), hold=6.0)
        _check_lost_in_time(w)
        await finish_ready(w, healed, f"sshd killed, restarted after 6 s ({route})",
                           lab_figures, tmp_path / "runs")


def _worker(run_id: str, rank: int) -> int:
    for pid in carriers(run_id):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).cmdline()[:1] == [f"VLLM::Worker_TP{rank}"]:
                return pid
    raise AssertionError(f"no Worker_TP{rank} in run {run_id}")


@pytest.mark.parametrize(("route", "how"), [("direct", "syntax-error"), ("jump", "kill -9")])
async def test_worker_dies_while_the_link_is_down(route: str, how: str, lab: Lab,
                                                  lab_profile: Callable[..., Path],
                                                  tmp_path: Path, cleanup: list[str],
                                                  lab_figures: dict[str, Any]) -> None:
    """Nobody watches when it dies; on reconnect both screens say DEAD, who, why, the code."""
    r = ROUTES[route]
    # syntax-error: the workers import the broken file 23 simulated s in: 11.5 s at x2
    profile = (lab_profile(r.host, "syntax-error", time_scale=2.0) if how == "syntax-error"
               else lab_profile(r.host))
    async with watching(profile, tmp_path) as w:
        cleanup.append(w.run_id)
        faulted, _ = await w.outage(lambda: lab.link_down(r.link_host), lambda: None, hold=0)
        _check_lost_in_time(w)
        down_since = time.time() - (time.monotonic() - faulted)
        if how == "kill -9":
            os.kill(_worker(w.run_id, 3), 9)
        exit_json = Path(w.sup.run.run_dir) / "exit.json"
        await w.until(exit_json.exists, 30, "the run to end while the link is down")
        await w.until(lambda: not carriers(w.run_id), 10, "every process of the run to end")
        over_at = time.time()
        assert w.sup.machine.state is not State.DEAD  # nobody has seen it yet
        while time.monotonic() < faulted + OUTAGE_S:
            await w.pilot.pause(0.05)
        lab.link_up(r.link_host)
        healed = time.monotonic()
        code = await asyncio.wait_for(w.cli.wait(), LOAD_TIMEOUT_S)
        await asyncio.sleep(0.2)  # the reader takes the last lines
        out = w.cli_text()
        assert code == 3, out
        dead = next(line for line in out.splitlines() if "DEAD:" in line)
        await w.until(lambda: w.sup.machine.state is State.DEAD
                      and "DEAD" in str(w.app.query_one("#banner").render()), 30,
                      "the console's DEAD")
        await w.pilot.pause(1.0)  # late lines sharpen the cause
        banner = str(w.app.query_one("#banner").render())
        exit_info = json.loads(exit_json.read_text())
        death = w.sup.machine.death
        assert death is not None
        if how == "syntax-error":
            deaths = [json.loads(x) for x in
                      (tmp_path / "gpus" / "deaths.jsonl").read_text().splitlines()]
            assert down_since < min(d["time"] for d in deaths) < over_at  # nobody watched
            assert "Worker_TP" in dead and "exit code 1" in dead, dead
            cause = next(line for line in out.splitlines() if "root cause" in line)
            assert "SyntaxError" in cause and "kimi_k25_patched.py, line 15" in cause, cause
            assert "SyntaxError" in banner and "exit code 1" in banner, banner
            assert death.process.startswith("Worker_TP") and death.code == 1
        else:
            assert "Worker_TP3" in dead and "signal 9" in dead, dead
            assert "Worker_TP3" in banner and "signal 9" in banner, banner
            assert death.process == "Worker_TP3" and death.signal == 9
        assert exit_info["code"] == 1, exit_info
        lab_figures[f"worker dies while the link is down ({route}, {how})"] = {
            "fault_to_lost_shown_s": {"wait": round(w.lost[0], 2),
                                      "console": round(w.lost[1], 2)},
            "heal_to_dead_shown_s": round(
                next(t for t, line in w.cli_lines if "DEAD:" in line) - healed, 2)}
