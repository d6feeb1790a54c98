"""Launch history, ETA from past launches, hooks, the smoke request and the spec-decode readout:
tables for the pure parts, real simulated launches for the rest."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import RUN_ID_ENV, async_wait_for, carriers, next_event, sim_profile

from tui.core.phases import Phase
from tui.core.profile import Profile, load_profile
from tui.core.protocol import HttpReply
from tui.core.state import Died, Ready, State
from tui.core.status import RunView, status_line, timeline_rows
from tui.core.timeline import PhaseSpan
from tui.supervise.history import History, Launch, diff
from tui.supervise.hooks import hook_env, run_hook
from tui.supervise.supervisor import (
    HistoryLoaded,
    Notice,
    SmokeDone,
    SpecDecodeSeen,
    Supervisor,
    smoke_result,
)

T0 = 1_800_000_000.0


def launch(run_id: str, started: float, took: float | None, **kw: object) -> Launch:
    kw.setdefault("phases", (("reading config", 1.0, 60.0), ("loading weights", 61.0, 660.0),
                             ("allocating KV cache", 721.0, 30.0)))
    kw.setdefault("profile", "kimi@gpu-7")
    kw.setdefault("host", "gpu-7")
    return Launch(run_id, started=started, outcome="ready" if took else "dead", took=took,
                  **kw)  # type: ignore[arg-type]


# -- the store --------------------------------------------------------------------------------

def test_history_records_finds_by_prefix_and_gives_medians(tmp_path: Path) -> None:
    h = History(tmp_path / "h.sqlite3")
    h.record(launch("kimi-20261201-a", T0, 800.0))
    h.record(launch("kimi-20261202-b", T0 + 86400, 900.0,
                    phases=(("loading weights", 61.0, 720.0),)))
    h.record(launch("kimi-20261203-c", T0 + 2 * 86400, None, exit_code=1, cause="SyntaxError"))
    assert [x.run_id for x in h.launches("kimi@gpu-7")] == [
        "kimi-20261203-c", "kimi-20261202-b", "kimi-20261201-a"]
    assert h.get("kimi-20261202").run_id == "kimi-20261202-b"
    with pytest.raises(LookupError):
        h.get("kimi-2026120")
    assert h.last("kimi@gpu-7", "gpu-7", before="kimi-20261203-c").run_id == "kimi-20261202-b"
    # only launches that reached READY count for the ETA
    assert h.expected_phases("kimi@gpu-7", "gpu-7") == {
        "reading config": 60.0, "loading weights": 690.0, "allocating KV cache": 30.0}
    assert h.update("kimi-20261203-c", outcome="stopped").outcome == "stopped"
    assert h.update("nope", outcome="x") is None


OLD_SCHEMA = """CREATE TABLE launches (run_id TEXT PRIMARY KEY, profile TEXT NOT NULL,
    host TEXT NOT NULL, command TEXT, args TEXT NOT NULL DEFAULT '[]',
    env_names TEXT NOT NULL DEFAULT '[]', engine_version TEXT, started REAL NOT NULL,
    outcome TEXT NOT NULL, took REAL, exit_code INTEGER, cause TEXT,
    phases TEXT NOT NULL DEFAULT '[]', ended REAL)"""


def test_a_history_from_before_slurm_gains_the_jobs_columns_and_keeps_its_rows(
        tmp_path: Path) -> None:
    """A database written before the job's columns: opened, it gains them; its rows read on
    (no job), and a job's launch records its id, nodes, queue wait and the scheduler's end."""
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute(OLD_SCHEMA)
    db.execute("INSERT INTO launches VALUES ('old-1','kimi@gpu-7','gpu-7','vllm serve','[]',"
               "'[]','0.16.0',?,'ready',800.0,NULL,NULL,'[]',NULL)", (T0,))
    db.commit()
    db.close()
    h = History(path)
    [old] = h.launches()
    assert (old.run_id, old.took, old.job_id, old.nodes, old.job_summary()) == (
        "old-1", 800.0, None, (), "")
    h.record(launch("job-1", T0 + 10, 30.0, job_id="494583", nodes=("node-07", "node-08"),
                    queued=133.0))
    h.update("job-1", job_end="TIMEOUT: the job's 4 h time limit ended it, 3 h 58 min after "
                              "READY")
    job = h.get("job-1")
    assert (job.job_id, job.nodes, job.queued) == ("494583", ("node-07", "node-08"), 133.0)
    assert job.job_summary() == ("job 494583 on node-07,node-08, queued 2m13s; TIMEOUT: the "
                                 "job's 4 h time limit ended it, 3 h 58 min after READY")
    assert History(path).get("old-1") == old  # opened again: nothing added twice, nothing lost


def test_diff_says_what_changed() -> None:
    a = launch("a", T0, 800.0, args=("--max-model-len", "8192"), env_names=("HF_TOKEN",),
               engine_version="0.16.0")
    b = launch("b", T0 + 1, None, args=("--max-model-len", "16384"),
               env_names=("HF_TOKEN", "VLLM_USE_V1"), engine_version="0.16.1rc1",
               phases=(("reading config", 1.0, 61.0), ("loading weights", 62.0, 1080.0)))
    assert diff(a, b) == [
        "args: -8192 +16384", "env: +VLLM_USE_V1", "engine version: 0.16.0 → 0.16.1rc1",
        "loading weights: 11m00s → 18m00s", "allocating KV cache: 30.0s → not reached",
        "outcome: READY in 13m20s → DEAD"]
    assert diff(a, a) == []


# -- ETA from the history ----------------------------------------------------------------------

USUAL = {"reading config": 60.0, "loading weights": 660.0, "allocating KV cache": 30.0}


@pytest.mark.parametrize(("now", "expected"), [
    (T0 + 361, "loading weights 43 % · 6m01s · ETA ~6m30s"),  # 360 s of weights + 30 s KV
    (T0 + 1141, "loading weights 43 % · 19m01s · ETA ~30.0s · ⚠ loading weights: 18m00s, "
                "usually 11m00s"),
])
def test_eta_and_overrun_come_from_past_launches(now: float, expected: str) -> None:
    spans = (PhaseSpan(Phase.CONFIG, T0 + 1, T0 + 61), PhaseSpan(Phase.WEIGHTS, T0 + 61, None,
                                                                 0.43))
    view = RunView(State.LOADING, spans, T0, None, 1500.0, usual=USUAL)
    assert status_line(view, now) == expected
    rows = timeline_rows(view, now)
    assert [r.usual_s for r in rows] == [None, 60.0, 660.0]  # the start-up row: no history
    assert rows[2].slow is (now - (T0 + 61) >= 990)


# -- hooks --------------------------------------------------------------------------------------

async def test_a_hook_gets_the_event_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    env = hook_env(os.environ, "dead", {"cause": "SyntaxError \x1b]0;x\x07here", "exit_code": 1})
    script = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    cmd = f"{sys.executable} -c {shlex.quote(script)}"
    assert await run_hook(cmd, env, 5) is None
    seen = json.loads(out.read_text())
    assert seen["SPECCONSOLE_EVENT"] == "dead" and seen["SPECCONSOLE_EXIT_CODE"] == "1"
    assert seen["SPECCONSOLE_CAUSE"] == "SyntaxError here"  # no escape sequence passes


async def test_a_failing_or_hanging_hook_is_said_not_waited_for() -> None:
    assert await run_hook("echo nope >&2; exit 3", dict(os.environ), 5) == "exited 3: nope"
    mark = f"hook-{os.getpid()}-{time.monotonic_ns()}"  # carried by the hook and its child
    assert await run_hook("sleep 30 & wait", {**os.environ, RUN_ID_ENV: mark}, 0.3) == \
        "timed out after 0.3s and was killed"
    await async_wait_for(lambda: not carriers(mark), 5, "the hook's processes to be gone")


# -- smoke replies -------------------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "kind", "expected"), [
    (HttpReply(200, 0.25, json.dumps({"choices": [{"text": "\n Hello there.\nMore"}],
                                      "usage": {"completion_tokens": 5}})), "completion",
     SmokeDone(True, 0.25, 5, "Hello there.")),
    (HttpReply(200, 0.5, json.dumps({"choices": [{"message": {"content": "Hi!"}}]})), "chat",
     SmokeDone(True, 0.5, None, "Hi!")),
    (HttpReply(500, 0.1, '{"error": "EngineCore encountered an issue"}'), "completion",
     SmokeDone(False, 0.1, None, "", 'HTTP 500: {"error": "EngineCore encountered an issue"}')),
    (HttpReply(None, 30.0, ""), "completion", SmokeDone(False, 30.0, None, "", "no answer: ")),
    (HttpReply(200, 0.1, "<html>"), "chat",
     SmokeDone(False, 0.1, None, "", "the reply is not an OpenAI answer")),
])
def test_smoke_reply_in_words(reply: HttpReply, kind: str, expected: SmokeDone) -> None:
    assert smoke_result(reply, kind) == expected


# -- on a real simulated launch -----------------------------------------------------------------

HOOKS = """
[alerts]
on_ready = "echo ready $SPECCONSOLE_RUN_ID >> {log}"
on_dead = "echo dead $SPECCONSOLE_PROCESS $SPECCONSOLE_EXIT_CODE $SPECCONSOLE_CAUSE >> {log}"
[smoke]
enabled = true
kind = "{kind}"
"""


@pytest.mark.parametrize("kind", ["completion", "chat"])
async def test_ready_launch_is_recorded_hooked_smoked_and_reads_spec_decoding(
        tmp_path: Path, cleanup: list[str], kind: str) -> None:
    log = tmp_path / "hooks.log"
    extra = HOOKS.format(log=log, kind=kind)
    profile = load_profile(sim_profile(tmp_path, "ready", time_scale=300, extra=extra),
                           environ={**os.environ, "HF_TOKEN": "hf_secretvalue123"})
    history = History(tmp_path / "h.sqlite3")
    sup = Supervisor(profile, history=history, environ={**os.environ})
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        cleanup.append(sup.run.run_id)
        loaded = await next_event(events, HistoryLoaded)
        assert loaded.previous is None and loaded.usual == {}
        ready = await next_event(events, Ready)
        smoke = await next_event(events, SmokeDone)
        assert smoke.ok and smoke.first_line.startswith("Hello"), smoke
        assert smoke.tokens == len(smoke.first_line.split())  # the sim's tokens are words
        record = history.get(sup.run.run_id)
        assert record.outcome == "ready" and record.took == pytest.approx(ready.took, abs=0.01)
        assert [p[0] for p in record.phases][:2] == ["launching", "reading config"]
        assert record.engine_version and "serve" in record.command
        spec = await next_event(events, SpecDecodeSeen, 30)
        while spec.totals.drafts == 0:  # the counters exist from the start, at zero
            spec = await next_event(events, SpecDecodeSeen, 30)
        assert len(spec.totals.accepted_per_position) == 5
        assert sup.machine.spec_decode is not None
        await sup.kill(1.0)
        assert history.get(sup.run.run_id).outcome == "ready"  # a kill after READY: still ready
    finally:
        await sup.close()
    assert log.read_text().split() == ["ready", sup.run.run_id]


async def test_dead_launch_is_recorded_with_its_cause_and_its_hook(tmp_path: Path,
                                                                   cleanup: list[str]) -> None:
    log = tmp_path / "hooks.log"
    profile = load_profile(sim_profile(tmp_path, "syntax-error", time_scale=75,
                                       extra=HOOKS.format(log=log, kind="completion")))
    history = History(tmp_path / "h.sqlite3")
    history.record(launch("syntax-error-older", T0, 800.0, profile=profile.key,
                          host=profile.host.target))
    sup = Supervisor(profile, history=history)
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        cleanup.append(sup.run.run_id)
        loaded = await next_event(events, HistoryLoaded)
        assert loaded.previous.run_id == "syntax-error-older"
        assert loaded.usual["loading weights"] == 660.0
        await next_event(events, Died)
        record = await async_wait_for(  # late lines sharpen the cause, and the record with it;
            # the log says the exit codes (the death's own, or its siblings')
            lambda: (r := history.get(sup.run.run_id)) is not None and r.cause is not None
            and "SyntaxError" in r.cause
            and (sup.machine.death.code is not None or sup.machine.reported_codes) and r,
            10, "the SyntaxError as the recorded cause and the exit codes in the log")
        death = sup.machine.death
        assert record.outcome == "dead" and record.exit_code == death.code
        assert record.cause == death.cause.line and "SyntaxError" in record.cause
        # every worker dies of the broken import within a millisecond or two; the one the
        # agent saw die first has exit code 1, unless its parent reaped it before the agent
        # read it and vLLM's log named a sibling instead: then unknown, on screen as here
        reported = sup.machine.reported_codes
        assert death.code == 1 or (death.code is None and reported
                                   and death.process not in reported), (death, reported)
        await sup.kill(1.0)
        assert history.get(sup.run.run_id).outcome == "dead"
    finally:
        await sup.close()  # waits for the hook
    line = log.read_text()
    said = " ".join(str(x) for x in ("dead", death.process, death.code) if x is not None)
    assert line.startswith(f"{said} SyntaxError"), line  # an unknown code: no variable
    assert sup.machine.state is State.STOPPED


async def test_a_broken_history_is_one_notice_and_supervision_goes_on(tmp_path: Path,
                                                                     cleanup: list[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", time_scale=300)),
                     history=History(blocker / "h.sqlite3"))
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        cleanup.append(sup.run.run_id)
        notice = await next_event(events, Notice)
        assert "launch history not written" in notice.text
        await next_event(events, Ready)
        await sup.kill(1.0)
    finally:
        await sup.close()
    assert carriers(sup.run.run_id) == []


def test_history_command_lists_and_diffs(tmp_path: Path) -> None:
    env = {**os.environ, "SPECCONSOLE_DATA_DIR": str(tmp_path)}
    history = History(tmp_path / "history.sqlite3")
    history.record(launch("kimi-20261201-a", T0, 800.0, engine_version="0.16.0"))
    history.record(launch("kimi-20261202-b", T0 + 60, None, exit_code=1,
                          cause="SyntaxError: invalid syntax (kimi_k25.py, line 12)",
                          ended=T0 + 83, engine_version="0.16.1rc1"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tui", *args], env=env, text=True,
                              capture_output=True, timeout=60)

    listed = cli("history")
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert "kimi-20261202-b" in lines[0] and "DEAD after 23.0s (exit 1): SyntaxError" in lines[0]
    assert "kimi-20261201-a" in lines[1] and "READY in 13m20s" in lines[1]
    changed = cli("history", "--diff", "kimi-20261201", "kimi-20261202")
    assert changed.returncode == 0
    assert "engine version: 0.16.0 → 0.16.1rc1" in changed.stdout
    missing = cli("history", "--diff", "kimi-2026", "zzz")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


async def test_history_never_holds_a_secret(tmp_path: Path, cleanup: list[str]) -> None:
    secret = "hf_NeverInHistory12345"
    profile = load_profile(sim_profile(tmp_path, "ready", time_scale=300))
    server = replace(profile.server, secret_env=("HF_TOKEN",),
                     args=(*profile.server.args, "--hf-token-echo", secret))
    history = History(tmp_path / "h.sqlite3")
    sup = Supervisor(replace(profile, server=server), history=history,
                     environ={**os.environ, "HF_TOKEN": secret})
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        cleanup.append(sup.run.run_id)
        await next_event(events, Ready)
        await sup.kill(1.0)
    finally:
        await sup.close()
    record = history.get(sup.run.run_id)
    assert "HF_TOKEN" in record.env_names and "«redacted»" in record.command
    assert secret.encode() not in (tmp_path / "h.sqlite3").read_bytes()


def test_survived_shapes_are_kept_per_profile_and_host_and_counted(tmp_path: Path) -> None:
    h = History(tmp_path / "h.sqlite3")
    h.note_survived("p", "gpu-1", ["A #", "B #"], T0)
    h.note_survived("p", "gpu-1", ["A #"], T0 + 60)
    h.note_survived("p", "gpu-2", ["C #"], T0)
    h.note_survived("p", "gpu-1", [], T0)  # nothing survived: nothing written
    assert h.survived("p", "gpu-1") == frozenset({"A #", "B #"})
    assert h.survived("q", "gpu-1") == frozenset()
    with sqlite3.connect(h.path) as db:
        assert db.execute("SELECT launches, last FROM survived WHERE shape = 'A #'").fetchone() \
            == (2, T0 + 60)


async def test_an_error_a_ready_launch_survived_is_recorded_and_read_by_the_next(
        tmp_path: Path, cleanup: list[str]) -> None:
    """READY after an ERROR record at startup: the history keeps its shape; the next launch
    of the profile on the host starts with it, so it is never that launch's cause while
    another is known (tui.core.ranking's tiers)."""
    harmless = "Failed to load plugin vllm_ext: ImportError: libext.so.12: cannot open it"
    path = sim_profile(tmp_path, "ready", time_scale=300)
    path.write_text(path.read_text().replace(
        "tensor_parallel_size = 8\n",
        f'tensor_parallel_size = 8\nargs = ["--sim-harmless-error", "{harmless}"]\n', 1))
    profile = load_profile(path)
    history = History(tmp_path / "h.sqlite3")
    first = await _launched_until(profile, history, cleanup, Ready)
    (kept,) = history.survived(profile.key, profile.host.target)
    # its numbers masked (written out here: the product's own shape() is what is tested), as
    # logged (the sim marks its lines)
    assert kept.startswith("Failed to load plugin vllm_ext: ImportError: libext.so.#: cannot "
                           "open it")
    second = await _launched_until(profile, history, cleanup, HistoryLoaded)
    assert kept in second.machine.tracker.survived
    assert first.run.run_id != second.run.run_id


async def _launched_until(profile: Profile, history: History, cleanup: list[str],
                          event: type) -> Supervisor:
    """Launch the profile, wait for the first `event`, kill the run and stop watching; the
    supervisor as it was then."""
    sup = Supervisor(profile, history=history)
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        cleanup.append(sup.run.run_id)
        await next_event(events, event)
        await sup.kill(1.0)
    finally:
        await sup.close()
    return sup


def test_explain_with_its_profile_sets_aside_what_good_launches_survived(tmp_path: Path) -> None:
    env = {**os.environ, "SPECCONSOLE_DATA_DIR": str(tmp_path)}
    profile = load_profile(sim_profile(tmp_path, "ready"))
    plugin = "Failed to load plugin vllm_ext: ImportError: libext.so.12: cannot open it"
    History(tmp_path / "history.sqlite3").note_survived(
        profile.key, profile.host.target,
        ["Failed to load plugin vllm_ext: ImportError: libext.so.#: cannot open it"], T0)
    log = tmp_path / "server.log"
    log.write_text(f"(APIServer pid=4) ERROR 12-03 08:18:40 [__init__.py:41] {plugin}\n"
                   "ValueError: max_model_len 262144 is larger than the model's 131072\n")

    def explain(*more: str) -> str:
        done = subprocess.run([sys.executable, "-m", "tui", "explain", str(log), *more],
                              env=env, text=True, capture_output=True, timeout=60)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return done.stdout

    assert "root cause:    Failed to load plugin" in explain()
    said = explain("--profile", str(profile.path))
    assert "root cause:    ValueError: max_model_len" in said
    assert "runner-up:     Failed to load plugin" in said
    assert "also logged by a launch of this profile that reached READY" in said


async def test_a_job_nearing_its_time_limit_runs_the_on_ending_hook(tmp_path: Path) -> None:
    """The time-left alert of a Slurm job reaches the profile's on_ending hook, as DEAD reaches
    on_dead: the job, the time left and the words in SPECCONSOLE_* variables."""
    from tui.supervise.events import JobEnding, RunInfo

    log = tmp_path / "hooks.log"
    extra = ('[alerts]\non_ending = "echo $SPECCONSOLE_EVENT $SPECCONSOLE_JOB_ID '
             f'$SPECCONSOLE_LEFT_S $SPECCONSOLE_CAUSE >> {log}"\n')
    sup = Supervisor(load_profile(sim_profile(tmp_path, "ready", extra=extra)))
    sup.run = RunInfo("run-1", str(tmp_path), 1, 0.0, attached=False)
    sup.emit([JobEnding("494583", 540.4)])
    await async_wait_for(log.exists, 10, "the on_ending hook")
    assert log.read_text() == ("ending 494583 540 job 494583 has 9 min left before its time "
                               "limit ends it\n")
