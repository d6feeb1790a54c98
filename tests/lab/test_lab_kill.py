"""Killing things through the real sshd (issue 4, items 4, 7, 8, 9): the console SIGKILLed
mid-load and started again, a kill that must escalate and sweep, leftovers of an API server
SIGKILLed, a hang; directly and through the jump host where the route adds proof.

The simulated load lasts about 30 s; the lab hosts are namespaces of this machine, so a test
sees the "remote" processes in /proc and the fake NVML state in the profile's gpu_state (each
test first checks that the server really runs in the lab host's network namespace). Every
client is a real `specconsole` subprocess (`wait`, `launch`, `kill`, `check`), as a user runs
it; the console (Textual Pilot, in-process) attaches afterwards where the log must be checked
line by line. Measured times go to the lab figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import alive, carriers, count_lines, nvml_dir
from test_kill_escalation import escapee_of
from test_leftovers import holders, with_args

from lab.netlab import Lab
from tui.console.app import ConsoleApp
from tui.core.profile import load_profile
from tui.core.state import State
from tui.supervise.supervisor import Supervisor

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
ROUTES = {"direct": "gpu-a", "jump": "gpu-b"}  # gpu-b is reached only through gpu-a
LOAD_TIMEOUT_S = 90.0
KILL_CLIENT_AT_S = 8.0  # after the launch: loading weights (the load takes about 30 s)
GRACE_S = 2.0
STALL_S = 4.0
STALL_MARGIN_S = 2.5  # tick (1 s), GPU sampling (1 s) and the link
LOAD_PHASES = ["launching", "reading config", "loading weights", "loading drafter", "compiling",
               "allocating KV cache", "capturing CUDA graphs", "starting API server",
               "application started", "serving"]
BEFORE_READY = LOAD_PHASES.index("capturing CUDA graphs") + 1
PHASE_RE = re.compile(r"^phase: (.+) \(at (.+)\)$")


@dataclass
class Cli:
    """A `specconsole` subprocess (own session) whose output lines are collected, stamped
    with time.monotonic(), as they come; JSON lines are parsed."""

    proc: asyncio.subprocess.Process
    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, *args: str) -> Cli:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui", *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "COLUMNS": "200"})
        cli = cls(proc, started)
        cli.reader = asyncio.create_task(cli._read())
        return cli

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            self.lines.append((time.monotonic(), raw.decode().rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def records(self) -> list[dict[str, Any]]:
        """The JSON lines of `wait --json` (anything else is skipped)."""
        out = []
        for _, line in self.lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out

    def said(self, text: str) -> float | None:
        """When a line containing `text` first came."""
        return next((t for t, line in self.lines if text in line), None)

    async def until(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := check()):
            assert time.monotonic() < deadline, \
                f"timed out after {timeout:g}s waiting for {what}\n{self.text()}"
            await asyncio.sleep(0.05)
        return value

    async def finish(self, timeout: float = LOAD_TIMEOUT_S) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        if self.reader is not None:
            await asyncio.wait_for(self.reader, 5)
        return code

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        if self.reader is not None:
            self.reader.cancel()


async def run_cli(*args: str, timeout: float = LOAD_TIMEOUT_S) -> tuple[int, str, float]:
    """A command to its end: exit code, output, seconds it took."""
    cli = await Cli.start(*args)
    try:
        code = await cli.finish(timeout)
    finally:
        await cli.stop()
    return code, cli.text(), time.monotonic() - cli.started


def launched(text: str) -> tuple[str, int]:
    """Run id and pid from `launch`'s or `wait`'s "launched run ..." line."""
    found = re.search(r"launched run (\S+) on \S+ \(pid (\d+)\)", text)
    assert found, text
    return found[1], int(found[2])


def in_lab_host(lab: Lab, host: str, pid: int) -> bool:
    """The process runs in the lab host's network namespace and this test sees it in /proc:
    what lets the checks below read the "remote" host's processes directly."""
    ns = Path("/run/netns") / lab.ns[host]
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == ns.stat().st_ino
    except OSError:
        return False


NVML_USED = ("import pynvml; pynvml.nvmlInit(); print(*(pynvml.nvmlDeviceGetMemoryInfo("
             "pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in "
             "range(pynvml.nvmlDeviceGetCount())))")


def nvml_used(lab: Lab, host: str, gpus: Path) -> list[int]:
    """Memory used per GPU as the NVML stand-in on the lab host reports it through the real
    nvidia-ml-py (what the agent and `nvidia-smi` would read there)."""
    result = lab.run_in(host, ["env", f"LD_LIBRARY_PATH={nvml_dir()}",
                               f"SPECCONSOLE_SIM_GPU_STATE={gpus}", sys.executable, "-c",
                               NVML_USED])
    assert result.returncode == 0, result.stderr
    return [int(x) for x in result.stdout.split()]


def phases(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(phase, "at" text) for each phase line of `wait --json`, in order."""
    return [(m[1], m[2]) for r in records if (m := PHASE_RE.match(r.get("msg", "")))]


def phases_right(seen: list[str]) -> bool:
    """Every phase up to the graphs once, in order; then API server phases in order (one
    that began at the same moment as the next may be folded into it)."""
    rest = iter(LOAD_PHASES[BEFORE_READY:])
    return (seen[:BEFORE_READY] == LOAD_PHASES[:BEFORE_READY]
            and all(p in rest for p in seen[BEFORE_READY:]))


def seconds(text: str) -> float:
    """"12.3s" or "1m04s" (units.duration) in seconds."""
    if text.endswith("s") and "m" not in text:
        return float(text[:-1])
    minutes, secs = text.rstrip("s").split("m")
    return int(minutes) * 60 + int(secs)


# ------------------------------------------------------------------------------ item 4

@pytest.mark.parametrize("route", ROUTES)
async def test_console_sigkilled_mid_load_reattaches_to_the_same_run(
        route: str, lab: Lab, lab_profile: Callable[..., Path], tmp_path: Path,
        cleanup: list[str], lab_figures: dict[str, Any]) -> None:
    """`wait --launch` SIGKILLed while the weights load, then started again (still with
    --launch): it attaches to the same run, nothing is launched twice, its phases are the
    load's, each once, and right after the replay the one the log is in; the console
    attaching too shows every line of the log once and the same phase; both end READY."""
    host = ROUTES[route]
    profile = lab_profile(host)
    runs = tmp_path / "runs"
    first = await Cli.start("wait", str(profile), "--launch", "--json", "--timeout", "120s")
    try:
        await first.until(lambda: first.said("launched run"), 30, "the launch")
        run_id, pid = launched(first.text())
        cleanup.append(run_id)
        assert in_lab_host(lab, host, pid)
        await first.until(lambda: time.monotonic() > first.started + KILL_CLIENT_AT_S
                          and first.said("phase: loading weights"), 30, "loading weights")
        before = [p for p, _ in phases(first.records())]
        os.kill(first.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert await first.finish(10) == -signal.SIGKILL
    finally:
        await first.stop()
    # the server never noticed: its whole tree is alive, still loading
    tree = set(carriers(run_id))
    assert pid in tree and len(tree) >= 10  # API server, engine core, 8 workers
    assert not (Path(runs / run_id) / "exit.json").exists()
    # the killed client's SSH sessions end on the host and the jump host: no stale watcher
    await first.until(lambda: all(len(lab.sshd_pids(h)) == 1 for h in {"gpu-a", host}), 15,
                      "the killed client's sshd sessions to end")

    second = await Cli.start("wait", str(profile), "--launch", "--json", "--timeout", "120s")
    sup = Supervisor(load_profile(profile))
    app = ConsoleApp(sup, launch=False, kill_grace=GRACE_S,
                     env={k: v for k, v in os.environ.items() if not k.startswith("TMUX")})
    try:
        await second.until(lambda: second.said("attached to run")
                           or second.said("launched run"), 30, "the second `wait`")
        reattach_s = second.said("attached to run") or 0.0
        head = second.records()[0]
        assert head["msg"].startswith(f"attached to run {run_id} ") and head["attached"], head
        assert head["pid"] == pid and head["run_id"] == run_id
        async with app.run_test(size=(160, 45)) as pilot:
            deadline = time.monotonic() + 30
            while sup.run is None or sup.machine.timeline is None \
                    or not sup.machine.timeline.spans:
                assert time.monotonic() < deadline, "the console never attached"
                await pilot.pause(0.05)
            assert sup.run.run_id == run_id and sup.run.pid == pid and sup.run.attached
            # the phase right after the replay is the one the log is in: still the weights
            # (they load from about 1 s to 25 s after the launch), on both screens
            await pilot.pause(1.0)
            assert time.monotonic() - first.started < 20, "attached too late to tell"
            progress = [r["progress"] for r in second.records() if "progress" in r]
            assert progress and progress[-1] < 1.0, progress
            assert before[-1] == "loading weights", before
            assert [p for p, _ in phases(second.records())][-1] == "loading weights"
            assert sup.machine.timeline.spans[-1].phase.label == "loading weights"
            assert sup.machine.state is State.LOADING
            deadline = time.monotonic() + LOAD_TIMEOUT_S
            while sup.machine.state is not State.READY:
                assert time.monotonic() < deadline, f"console not READY: {sup.machine.state}"
                await pilot.pause(0.1)
            code = await second.finish()
            out = second.text()
            assert code == 0, out
            assert "READY after" in out
            # one run, one launch: the same pid serves it, no second run dir on the host
            assert [p.name for p in runs.iterdir()] == [run_id]
            assert pid in carriers(run_id) and "launched run" not in out
            tree = carriers(run_id)
            assert all(p == pid or pid in {a.pid for a in psutil.Process(p).parents()}
                       for p in tree), tree  # one process tree
            # phases: the whole load's, each once, in time order. (Their times are not
            # compared with what the killed client saw: replayed lines count from their
            # stamps, and the simulator stamps on its own clock, 50x real time.)
            again = phases(second.records())
            assert phases_right([p for p, _ in again]), again
            assert len({p for p, _ in again}) == len(again), again
            ats = [seconds(at) for _, at in again]
            assert ats == sorted(ats), again
            labels = [s.phase.label for s in sup.machine.timeline.spans]
            assert phases_right(labels), labels
            # the console: every line of the log exactly once, from its first byte
            window = app.window
            assert window.evicted == {True: 0, False: 0}
            count = count_lines([e.line for e in window.view(raw=True)],
                                Path(sup.run.run_dir) / "server.log")
            assert count.processes >= 8 and count.seq_faults == [], count.seq_faults
            assert count.stray == 0 and not count.out_of_order
            assert (count.lost, count.duplicated) == (0, 0), count
            # ... and the console got at least as far as the READY line
            log = (Path(sup.run.run_dir) / "server.log").read_bytes()
            ready_line = log.rfind(b"\n", 0, log.index(b"Application startup complete")) + 1
            assert ready_line in {e.line.offset for e in window.view(raw=True)}
    finally:
        await second.stop()
    lab_figures[f"client SIGKILLed mid-load, reattached ({route})"] = {
        "restart_to_attached_s": round(reattach_s - second.started, 2),
        "kill_to_attached_s": round(reattach_s - killed_at, 2),
        "lines_shown": count.shown, "lines_lost": count.lost,
        "lines_duplicated": count.duplicated}


# ------------------------------------------------------------------------------ item 7

def kill_steps(out: str) -> dict[str, list[int]]:
    """`kill`'s "  STEP: pid, pid" lines, in order ("nothing to signal" is no pid)."""
    steps: dict[str, list[int]] = {}
    for line in out.splitlines():
        found = re.match(r"^  ([A-Z]+): (.*)$", line)
        if found:
            steps[found[1]] = [int(p) for p in re.findall(r"\d+", found[2])]
    return steps


async def poll(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `check` (without blocking the loop) until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(0.05)
    return value


@pytest.mark.parametrize("route", ROUTES)
async def test_kill_escalates_to_kill_and_sweeps_the_escapee(
        route: str, lab: Lab, lab_profile: Callable[..., Path], tmp_path: Path,
        cleanup: list[str], lab_figures: dict[str, Any]) -> None:
    """Every process ignores TERM and one escaped the session holding GPU memory: `kill`
    (the CLI) sends TERM, KILL after the grace, then the sweep by SPECCONSOLE_RUN_ID finds
    the escapee; no process of the run remains on the host, the fake NVML is empty."""
    host = ROUTES[route]
    profile = with_args(lab_profile(host, name=f"escalate-{route}"),
                        "--sim-ignore-sigterm", "--sim-escapee")
    gpus = tmp_path / "gpus"
    code, out, _ = await run_cli("launch", str(profile))
    assert code == 0, out
    run_id, pid = launched(out)
    cleanup.append(run_id)
    await poll(lambda: len(holders(gpus)) >= 9 and escapee_of(run_id), 30,
               "8 workers and the escapee to hold GPU memory")
    escapee = escapee_of(run_id)
    assert escapee is not None
    workers = sorted(p for p in holders(gpus) if p != escapee)
    assert len(workers) == 8
    for p in (pid, escapee, *workers):  # on the lab host, and seen here in /proc
        assert in_lab_host(lab, host, p), p
    assert os.getsid(escapee) != os.getsid(pid) and os.getpgid(escapee) != os.getpgid(pid)
    assert psutil.Process(escapee).ppid() not in carriers(run_id)  # nobody's child

    code, out, took = await run_cli("kill", str(profile), "--grace", f"{GRACE_S:g}")
    assert code == 0, out
    steps = kill_steps(out)
    assert list(steps) == ["TERM", "KILL", "SWEEP"], out
    assert pid in steps["TERM"] and set(workers) <= set(steps["TERM"]), out
    assert escapee not in steps["TERM"] and escapee not in steps["KILL"], out
    assert set(workers) <= set(steps["KILL"]), out  # nobody obeyed TERM
    assert steps["SWEEP"] == [escapee], out
    assert "no process of the run remains; GPU memory released" in out, out
    assert took >= GRACE_S, took
    assert carriers(run_id) == []
    assert not any(alive(p) for p in (pid, escapee, *workers))
    assert holders(gpus) == {}  # the fake NVML: every byte released
    assert nvml_used(lab, host, gpus) == [0] * 8
    lab_figures[f"kill: TERM ignored, KILL after {GRACE_S:g}s, escapee swept ({route})"] = {
        "kill_command_s": round(took, 2), "term": len(steps["TERM"]),
        "killed": len(steps["KILL"]), "swept": len(steps["SWEEP"])}


# ------------------------------------------------------------------------------ item 8

@pytest.mark.parametrize("route", ROUTES)
async def test_leftovers_are_named_then_killed_exactly_by_launch(
        route: str, lab: Lab, lab_profile: Callable[..., Path], tmp_path: Path,
        cleanup: list[str], lab_figures: dict[str, Any]) -> None:
    """The API server SIGKILLed mid-load leaves its engine core and workers holding GPU
    memory (as vLLM's do); a relaunch is refused naming each holder by pid; `launch
    --kill-leftovers` kills exactly them, checks the memory is released, then launches."""
    host = ROUTES[route]
    profile = with_args(lab_profile(host, name=f"leftovers-{route}"), "--sim-orphans")
    gpus, runs = tmp_path / "gpus", tmp_path / "runs"
    code, out, _ = await run_cli("launch", str(profile))
    assert code == 0, out
    run_id, pid = launched(out)
    cleanup.append(run_id)
    await poll(lambda: len(holders(gpus)) == 8, 30, "the workers to hold GPU memory")
    assert in_lab_host(lab, host, pid)
    os.kill(pid, signal.SIGKILL)
    await poll((runs / run_id / "exit.json").exists, 30, "the monitor to record the end")
    workers = sorted(holders(gpus))
    assert len(workers) == 8 and set(workers) <= set(carriers(run_id))
    assert all(in_lab_host(lab, host, p) for p in workers)
    assert all(used > 0 for used in nvml_used(lab, host, gpus))

    code, out, _ = await run_cli("launch", str(profile))
    assert code == 6, out  # preflight refused
    for rank, worker in enumerate(workers):  # the workers start in rank order
        assert f"held by pid {worker} (Worker_TP{rank}) of run {run_id}, which has ended" \
            in out, out
    assert f"(pids {', '.join(map(str, workers))})" in out and "--kill-leftovers" in out, out
    assert "Traceback" not in out
    assert [p.name for p in runs.iterdir()] == [run_id]  # nothing launched
    assert all(alive(p) for p in workers)  # and nothing killed without the flag

    code, out, took = await run_cli("launch", str(profile), "--kill-leftovers")
    assert code == 0, out
    second, second_pid = launched(out)
    cleanup.append(second)
    assert f"leftovers TERM: {', '.join(map(str, workers))}" in out, out
    assert "leftovers gone" in out and "GPU memory released" in out, out
    assert out.index("leftovers gone") < out.index("launched run"), out
    assert not any(alive(p) for p in workers)
    assert not set(workers) & set(holders(gpus))
    # nothing of run 1 remains: its engine core, which held no GPU memory, ends with them
    await poll(lambda: not carriers(run_id), 10, "run 1's engine core to end")
    assert sorted(p.name for p in runs.iterdir()) == sorted([run_id, second])
    assert alive(second_pid) and in_lab_host(lab, host, second_pid)
    code, out, _ = await run_cli("kill", str(profile), "--grace", f"{GRACE_S:g}")
    assert code == 0, out
    lab_figures[f"leftovers named, then launch --kill-leftovers ({route})"] = {
        "leftovers": len(workers), "kill_leftovers_and_launch_s": round(took, 2)}


# ------------------------------------------------------------------------------ item 9

async def test_hang_is_stalled_in_time_naming_the_frozen_gpus(
        lab: Lab, lab_profile: Callable[..., Path], tmp_path: Path, cleanup: list[str],
        lab_figures: dict[str, Any]) -> None:
    """The workers hang mid-weights (no more lines, memory frozen, alive): `wait` says
    STALLED within the stall timeout (+ a margin) of the last line written, with the seconds
    since it and the GPUs whose memory stopped, as the fake NVML shows them."""
    profile = lab_profile("gpu-a", "hang", stall_timeout=f"{STALL_S:g}s")
    gpus = tmp_path / "gpus"
    cli = await Cli.start("wait", str(profile), "--launch", "--json", "--timeout", "60s")
    try:
        code = await cli.finish(70)
    finally:
        await cli.stop()
    records = cli.records()
    assert records and records[0].get("run_id"), cli.text()
    run_id, pid = records[0]["run_id"], records[0]["pid"]
    cleanup.append(run_id)
    assert code == 5, cli.text()  # EXIT_STALLED
    at, line = next((t, ln) for t, ln in cli.lines if "STALLED" in ln)
    stalled_epoch = time.time() - (time.monotonic() - at)
    msg = json.loads(line)["msg"]
    found = re.fullmatch(
        r"STALLED: no log line for (\d+)s, GPU memory and utilisation frozen on ([\d, ]+)", msg)
    assert found, msg
    quiet_said, named = int(found[1]), [int(g) for g in found[2].split(", ")]
    last_written = (Path(tmp_path / "runs" / run_id / "server.log")).stat().st_mtime
    quiet = stalled_epoch - last_written
    assert STALL_S <= quiet <= STALL_S + STALL_MARGIN_S, quiet
    assert abs(quiet_said - quiet) <= 1.5, (quiet_said, quiet)
    assert "phase: loading weights" in cli.text()
    # the GPUs named are those the hung workers hold, and their memory really stopped
    assert in_lab_host(lab, "gpu-a", pid) and alive(pid)  # hung, not dead
    held = holders(gpus)
    assert len(held) == 8 and named == sorted(held.values()), (named, held)
    before = {p.name: json.loads(p.read_text())["used"] for p in gpus.glob("holder-*.json")}
    await asyncio.sleep(1.1)
    after = {p.name: json.loads(p.read_text())["used"] for p in gpus.glob("holder-*.json")}
    assert before == after and len(before) == 8
    code, out, _ = await run_cli("kill", str(profile), "--grace", "1")
    assert code == 0, out
    lab_figures[f"hang: STALLED with stall_timeout {STALL_S:g}s"] = {
        "last_line_to_stalled_s": round(quiet, 2), "said_quiet_s": quiet_said,
        "gpus_named": len(named)}
