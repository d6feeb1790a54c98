"""LaunchMachine: agent facts in, domain events out — deaths, readiness, stalls, kills."""

from __future__ import annotations

import pytest

from tui.core.describe import death_lines
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.phases import Phase
from tui.core.protocol import GpuInfo, Gpus, Health, ProcExit, ProcInfo, Procs, RunExit
from tui.core.state import (
    CauseUpdated,
    Died,
    HelperExited,
    LaunchMachine,
    PhaseChanged,
    Ready,
    ReadyLimit,
    ReadyTimedOut,
    Stalled,
    State,
)

T0 = 1_000.0
STORY = [
    "(APIServer pid=100) INFO 12-02 10:00:00 [utils.py:302] vLLM API server version 0.16.1rc1",
    "(APIServer pid=100) INFO 12-02 10:00:01 [utils.py:253] non-default args: {'model': 'k'}",
    "(EngineCore_DP0 pid=200) ERROR 12-02 10:00:05 [gpt_oss_triton_kernels_moe.py:60] Failed to"
    " import Triton kernels. Please make sure your triton version is compatible. Error: cannot"
    " import name 'SparseMatrix' from 'triton_kernels.tensor'",
    "(Worker_TP3 pid=303) INFO 12-02 10:00:06 [gpu_model_runner.py:2000] Starting to load model k",
    "(Worker_TP3 pid=303) Traceback (most recent call last):",
    '(Worker_TP3 pid=303)   File "/opt/vllm/model_executor/models/kimi_k25.py", line 12',
    "(Worker_TP3 pid=303)     from .deepseek_v2 import (DeepseekV2Model",
    "(Worker_TP3 pid=303)                           ^",
    "(Worker_TP3 pid=303) SyntaxError: '(' was never closed",
]
SYMPTOM = ("(APIServer pid=100) RuntimeError: Engine core initialization failed. See root cause "
           "above. Failed core proc(s): {'EngineCore_DP0': 1}")


def _machine(stall: float = 60.0) -> LaunchMachine:
    m = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")), stall_timeout_s=stall,
                      expected_load_s=1500.0)
    m.started(100, T0, T0)
    return m


def _feed(m: LaunchMachine, lines: list[str], at: float) -> list[object]:
    return m.feed_lines(enumerate(lines), at)


def test_the_story_worker_death_is_dead_with_the_syntax_error_as_cause() -> None:
    m = _machine()
    events = _feed(m, STORY, T0 + 20)
    assert [e.phase for e in events if isinstance(e, PhaseChanged)] == [
        Phase.LAUNCH, Phase.CONFIG, Phase.WEIGHTS]
    died = m.feed_exit(ProcExit(303, "Worker_TP3", 1, None, T0 + 23, False), T0 + 23)
    assert m.state is State.DEAD
    death = next(e for e in died if isinstance(e, Died)).death
    assert (death.process, death.code, death.phase) == ("Worker_TP3", 1, Phase.WEIGHTS)
    assert abs(death.since_launch - 23) < 1e-6
    assert death.cause is not None and "SyntaxError" in death.cause.line
    assert "kimi_k25.py" in death.cause.line and "12" in death.cause.line
    # the API server's symptom and later deaths never replace the cause or the first death
    later = _feed(m, [SYMPTOM], T0 + 24)
    later += m.feed_exit(ProcExit(200, "EngineCore_DP0", 1, None, T0 + 24, False), T0 + 24)
    later += m.feed_run_exit(RunExit(100, 1, None, T0 + 25), T0 + 25)
    assert not [e for e in later if isinstance(e, Died)]
    assert m.death is not None and "SyntaxError" in (m.death.cause.line if m.death.cause else "")
    assert m.death.process == "Worker_TP3"


def test_cause_arriving_after_the_death_updates_it() -> None:
    m = _machine()
    _feed(m, STORY[:4], T0 + 5)
    died = m.feed_exit(ProcExit(303, "Worker_TP3", 1, None, T0 + 6, False), T0 + 6)
    assert any(isinstance(e, Died) for e in died)
    updates = _feed(m, STORY[4:], T0 + 6.1)
    update = [e for e in updates if isinstance(e, CauseUpdated)]
    assert update and "SyntaxError" in update[-1].death.cause.line


def test_exit_codes_lie_engine_killed_while_serving_is_dead() -> None:
    m = _machine()
    _feed(m, STORY[:2], T0 + 1)
    assert not m.feed_health(Health(False, "/health", None, T0 + 2), T0 + 2)
    assert not m.feed_health(Health(True, "/v1/models", 200, T0 + 29), T0 + 29)
    assert m.state is State.LOADING  # /health has not answered yet
    ready = m.feed_health(Health(True, "/health", 200, T0 + 30), T0 + 30)
    assert m.state is State.READY and any(isinstance(e, Ready) for e in ready)
    events = m.feed_exit(ProcExit(200, "EngineCore", None, 9, T0 + 60, False), T0 + 60)
    assert m.state is State.DEAD and any(isinstance(e, Died) for e in events)
    assert m.death is not None and m.death.signal == 9
    m.feed_run_exit(RunExit(100, 0, None, T0 + 61), T0 + 61)
    assert m.state is State.DEAD and m.death.process == "EngineCore"


def test_top_process_exit_code_zero_is_still_a_death() -> None:
    m = _machine()
    m.feed_run_exit(RunExit(100, 0, None, T0 + 3), T0 + 3)
    assert m.state is State.DEAD and m.death is not None and m.death.code == 0


def test_log_line_alone_is_not_ready() -> None:
    m = _machine()
    _feed(m, ["INFO:     Application startup complete."], T0 + 10)
    assert m.state is State.LOADING and m.ready_log_at is not None


def test_helper_processes_exiting_cleanly_are_not_deaths() -> None:
    m = _machine()
    assert m.feed_exit(ProcExit(400, "python3", 0, None, T0 + 8, False), T0 + 8) == []
    assert m.feed_exit(ProcExit(402, "python3", None, None, T0 + 8, False), T0 + 8) == []
    events = m.feed_exit(ProcExit(401, "cc1plus", 1, None, T0 + 9, False), T0 + 9)
    assert [type(e) for e in events] == [HelperExited]
    assert m.state is State.STARTING


def test_a_command_a_shell_ran_failing_is_the_scripts_business() -> None:
    """`ray start`'s scripts run `readlink` that exits 1 by design (the fault lab's Ray head,
    2026-12-06): a shell's command failing is reported, never the run's death; the same
    command run by the engine is."""
    m = _machine()
    events = m.feed_exit(ProcExit(405, "readlink", 1, None, T0 + 9, False, parent="bash"), T0 + 9)
    assert [type(e) for e in events] == [HelperExited] and m.state is State.STARTING
    events = m.feed_exit(ProcExit(406, "readlink", 1, None, T0 + 9, False,
                                  parent="EngineCore_DP0"), T0 + 9)
    assert any(isinstance(e, Died) for e in events) and m.state is State.DEAD


def test_any_other_process_that_fails_is_a_death() -> None:
    m = _machine()
    events = m.feed_exit(ProcExit(404, "python3", None, 11, T0 + 9, False), T0 + 9)
    assert any(isinstance(e, Died) for e in events) and m.state is State.DEAD


def test_a_forked_child_under_its_parents_title_is_not_that_process() -> None:
    """A worker's compiler child adopted between its fork and its exec carries the worker's
    title; reaped by the worker before its exit was read, it once read as Worker_TP1 dead
    (the vLLM lane's two-node run, CI of 2026-12-06).  It is the worker's child: a clean or
    unknown end is nothing, a failure is a death under its own words."""
    m = _machine()
    _feed(m, STORY[:4], T0 + 5)
    assert m.feed_exit(ProcExit(500, "Worker_TP3", None, None, T0 + 8, False,
                                forked=True), T0 + 8) == []
    assert m.feed_exit(ProcExit(501, "Worker_TP3", 0, None, T0 + 8, False,
                                forked=True), T0 + 8) == []
    assert m.death is None and m.state.live
    killed = m.feed_exit(ProcExit(502, "Worker_TP3", None, 9, T0 + 9, False, forked=True),
                         T0 + 9)
    death = next(e for e in killed if isinstance(e, Died)).death
    assert (death.process, death.pid, death.signal) == ("child of Worker_TP3", 502, 9)
    # the process pane and the supervisor's ProcEnded tell each end the same way
    assert m.ended_as(ProcExit(500, "Worker_TP3", None, None, T0 + 8, False, forked=True)
                      ).name == "child of Worker_TP3"
    assert m.ended_as(ProcExit(503, "Worker_TP3", -9, None, T0 + 9, False)
                      ) == ProcExit(503, "Worker_TP3", None, 9, T0 + 9, False)


def test_a_forked_process_the_log_speaks_for_is_itself() -> None:
    """A worker forked from its engine that died before retitling, but logged under its own
    pid: the log's name is its own, and its end is the run's death."""
    m = _machine()
    _feed(m, STORY, T0 + 20)
    died = m.feed_exit(ProcExit(303, "EngineCore_DP0", None, None, T0 + 23, False,
                                forked=True), T0 + 23)
    death = next(e for e in died if isinstance(e, Died)).death
    assert (death.process, death.pid) == ("Worker_TP3", 303)


def test_a_zombie_engine_core_known_only_by_its_truncated_comm_is_a_death() -> None:
    m = _machine()
    m.feed_exit(ProcExit(200, "EngineCor", 0, None, T0 + 9, False), T0 + 9)
    assert m.state is State.DEAD


def test_attached_after_the_fact_the_log_names_who_died_first() -> None:
    m = _machine()
    _feed(m, [*STORY, "(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249]"
                      " Worker proc Worker_TP3 died unexpectedly (exit code: 1), shutting down "
                      "executor.", SYMPTOM], T0 + 30)
    m.feed_run_exit(RunExit(100, 1, None, T0 + 25), T0 + 30)
    assert m.death is not None and (m.death.process, m.death.pid, m.death.code) == (
        "Worker_TP3", 303, 1)


@pytest.mark.parametrize("seen", ["live", "after the fact"])
def test_a_reported_negative_exit_code_is_the_signal_that_killed_it(seen: str) -> None:
    """vLLM (multiprocessing) reports a worker killed by SIGKILL as exit code -9."""
    m = _machine()
    if seen == "live":  # the agent saw it end, but its parent reaped it: code unknown
        m.feed_exit(ProcExit(303, "Worker_TP3", None, None, T0 + 6, False), T0 + 6)
    _feed(m, ["(Worker_TP3 pid=303) INFO 12-02 10:00:06 [gpu_model_runner.py:2000] Starting",
              "(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249]"
              " Worker proc Worker_TP3 died unexpectedly (exit code: -9), shutting down "
              "executor."], T0 + 7)
    if seen == "after the fact":
        m.feed_run_exit(RunExit(100, 1, None, T0 + 25), T0 + 30)
    assert m.death is not None and (m.death.process, m.death.code, m.death.signal) == (
        "Worker_TP3", None, 9)
    assert "signal 9" in m.death.summary()


def test_a_log_lends_how_a_process_ended_to_another_hosts_death() -> None:
    """The head's log reports a headless node's worker (supervise.group lends it to the death
    the node's agent saw without a status): (code, signal), a negative code a signal."""
    m = _machine()
    assert m.reported_status("Worker_TP4") is None
    _feed(m, ["(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249]"
              " Worker proc Worker_TP4 died unexpectedly (exit code: -9), shutting down "
              "executor."], T0 + 7)
    assert m.reported_status("Worker_TP4") == (None, 9)
    assert m.reported_status("Worker_TP3") is None


def test_a_reported_code_is_taken_under_the_name_the_process_was_logged_by_before() -> None:
    """vLLM's CPU worker logs first as VllmWorker-0, then as Worker; its engine core reports
    its death by the first name (the vLLM lane's worker SIGKILLed inside a Slurm job)."""
    m = _machine()
    _feed(m, ["(VllmWorker-0 pid=303) WARNING 12-07 19:23:17 [vllm.py:725] Model Runner V2 "
              "requires Triton; using the V1 model runner instead.",
              "(Worker pid=303) INFO 12-07 19:25:27 [cpu_model_runner.py:68] Starting to load "
              "model /models/tiny-llama..."], T0 + 5)
    m.feed_exit(ProcExit(303, "VLLM::Worker", None, None, T0 + 6, False), T0 + 6)
    assert m.death is not None and (m.death.process, m.death.signal) == ("Worker", None)
    events = _feed(m, ["(EngineCore pid=200) ERROR 12-07 19:25:32 [multiproc_executor.py:315] "
                       "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting "
                       "down executor."], T0 + 7)
    assert (m.death.process, m.death.code, m.death.signal) == ("Worker", None, 9)
    assert any(isinstance(e, CauseUpdated) for e in events)


def test_stall_needs_a_quiet_log_and_frozen_gpu_memory() -> None:
    m = _machine(stall=60.0)
    _feed(m, STORY[:4], T0 + 1)

    def gpus(at: float, used: list[int]) -> None:
        m.feed_gpus(Gpus(at, tuple(GpuInfo(i, "H200", u, 100, 0) for i, u in enumerate(used))),
                    at)

    gpus(T0 + 1, [1, 1])
    gpus(T0 + 50, [1, 2])                      # GPU 1 still growing
    assert m.tick(T0 + 100) == []              # quiet log, but memory moved 50 s ago
    events = m.tick(T0 + 112)
    stall = next(e for e in events if isinstance(e, Stalled))
    assert m.state is State.STALLED and stall.frozen_gpus == (0, 1)
    assert stall.quiet_s >= 60
    _feed(m, ["(Worker_TP0 pid=1) WARNING 12-02 10:05:00 [shm_broadcast.py:466] No available "
              "shared memory broadcast block found in 60 seconds."], T0 + 120)
    assert m.state is State.STALLED            # a hang's heartbeat is not progress
    _feed(m, ["Loading safetensors checkpoint shards:  50% Completed | 32/64 [10:00<10:00]"],
          T0 + 130)
    assert m.state is State.LOADING


def test_kill_is_not_a_death() -> None:
    m = _machine()
    m.killing(T0 + 5)
    assert m.feed_exit(ProcExit(303, "Worker_TP3", None, 15, T0 + 5.1, False), T0 + 5.1) == []
    m.feed_run_exit(RunExit(100, None, 15, T0 + 5.3), T0 + 5.3)
    assert m.state is State.STOPPED and m.death is None


def test_phases_never_go_backwards_and_shard_progress_is_kept() -> None:
    m = _machine()
    _feed(m, ["(Worker_TP0 pid=1) INFO 12-02 10:00:00 [gpu_model_runner.py:1] Starting to load "
              "model k...",
              "Loading safetensors checkpoint shards:  25% Completed | 16/64 [05:00<15:00]",
              "(APIServer pid=100) INFO 12-02 10:00:01 [utils.py:253] non-default args: {}"],
          T0 + 300)
    assert m.timeline is not None and m.timeline.current is not None
    assert m.timeline.current.phase is Phase.WEIGHTS
    assert m.timeline.current.shards == (16, 64)
    assert m.timeline.eta(T0 + 300) == 1200.0


def test_an_exit_code_the_agent_missed_is_taken_from_the_log() -> None:
    m = _machine()
    m.feed_exit(ProcExit(303, "Worker_TP3", None, None, T0 + 6, False), T0 + 6)
    assert m.death is not None and m.death.code is None
    other = _feed(m, ["(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249]"
                      " Worker proc Worker_TP5 died unexpectedly (exit code: 7), shutting down "
                      "executor."], T0 + 7)
    assert m.death.code is None and not [e for e in other if isinstance(e, CauseUpdated)]
    events = _feed(m, ["(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249]"
                       " Worker proc Worker_TP3 died unexpectedly (exit code: 1), shutting down "
                       "executor."], T0 + 7)
    assert m.death.code == 1 and any(isinstance(e, CauseUpdated) for e in events)


REPORT_TP0 = ("(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249] Worker "
              "proc Worker_TP0 died unexpectedly (exit code: 1), shutting down executor.")


@pytest.mark.parametrize("log_first", [False, True])
@pytest.mark.parametrize(("apart", "taken"), [(0.01, True), (0.2, True), (2.0, False)])
def test_workers_dying_together_take_vllms_account_of_which_failed(
        log_first: bool, apart: float, taken: bool) -> None:
    """Several workers die of one broken import; the agent saw Worker_TP1 first but could not
    read its code (its parent reaped it), and vLLM names Worker_TP0, which died with it."""
    m = _machine()
    if log_first:
        _feed(m, [REPORT_TP0], T0 + 6)
    died = m.feed_exit(ProcExit(301, "Worker_TP1", None, None, T0 + 6, False), T0 + 6)
    assert next(e for e in died if isinstance(e, Died)).death.process == "Worker_TP1"
    events = m.feed_exit(ProcExit(300, "Worker_TP0", None, None, T0 + 6 + apart, False),
                         T0 + 6 + apart)
    if not log_first:
        events += _feed(m, [REPORT_TP0], T0 + 7)
    assert m.death is not None
    if taken:
        assert (m.death.pid, m.death.process, m.death.code) == (300, "Worker_TP0", 1)
        assert m.death.at == T0 + 6  # the run died when the first death was seen
        assert any(isinstance(e, CauseUpdated) for e in events)
    else:  # it died later, of the shutdown: not the run's death
        assert (m.death.process, m.death.code) == ("Worker_TP1", None)


def test_a_young_death_takes_vllms_name_and_reported_code_from_the_log() -> None:
    """The agent saw the worker only as a fork of the engine core, and its parent reaped it."""
    m = _machine()
    _feed(m, [*STORY, "(EngineCore_DP0 pid=200) ERROR 12-02 10:00:07 [multiproc_executor.py:249]"
                      " Worker proc Worker_TP3 died unexpectedly (exit code: 1), shutting down "
                      "executor."], T0 + 6)
    events = m.feed_exit(ProcExit(303, "EngineCore_DP0", None, None, T0 + 6, False), T0 + 6)
    death = next(e for e in events if isinstance(e, Died)).death
    assert (death.process, death.code) == ("Worker_TP3", 1)


INSPECT_CMD = "/venv/bin/python3 -m vllm.model_executor.models.registry"
CALLED_PROCESS_ERROR = (
    "(APIServer pid=100) ERROR 12-03 08:18:44 [registry.py:1120] subprocess.CalledProcessError: "
    "Command '['/venv/bin/python3', '-m', 'vllm.model_executor.models.registry']' returned "
    "non-zero exit status {code}.")


@pytest.mark.parametrize(("cmd", "code", "dead"), [
    (INSPECT_CMD, 1, True),         # the model inspection failed: the run's first death
    (INSPECT_CMD, 0, False),        # (a parent never reports 0 this way; no death)
    ("/venv/bin/python3 -m other", 1, False),  # some other command failed: not this process
])
def test_a_reaped_child_reported_failing_by_its_parent_is_a_death(cmd: str, code: int,
                                                                 dead: bool) -> None:
    m = _machine()
    m.feed_procs(Procs(T0 + 1, (ProcInfo(77, 100, "python3", cmd, "S", 0.0, 1, T0 + 1, True),)))
    assert m.feed_exit(ProcExit(77, "python3", None, None, T0 + 8, False), T0 + 8) == []
    events = _feed(m, [CALLED_PROCESS_ERROR.format(code=code)], T0 + 8.2)
    died = [e for e in events if isinstance(e, Died)]
    assert bool(died) is dead and (m.state is State.DEAD) is dead
    if dead:
        assert (died[0].death.pid, died[0].death.code, died[0].death.at) == (77, 1, T0 + 8)
        assert died[0].death.process == "model inspection"  # named by its command line
    assert m.names() == {77: "model inspection" if cmd == INSPECT_CMD else "python3"}


def test_a_death_seen_before_the_log_names_its_process_is_renamed_by_the_log() -> None:
    m = _machine()
    m.feed_exit(ProcExit(1200, "mp-spawn", 0, None, T0 + 5, False), T0 + 5)
    assert m.death is not None and m.death.process == "mp-spawn"
    events = _feed(m, ["(VllmWorker-0 pid=1200) ERROR 12-03 07:59:41 [multiproc_executor.py:953]"
                       " WorkerProc failed to start."], T0 + 5.1)
    assert m.death.process == "VllmWorker-0"
    assert any(isinstance(e, CauseUpdated) and e.death.process == "VllmWorker-0" for e in events)


def _unhealthy(m: LaunchMachine, at: float) -> None:
    """The agent's first round of health probes: nothing listens yet."""
    for path in m.health_paths:
        m.feed_health(Health(False, path, None, at), at)


def test_not_ready_within_the_ready_timeout_is_given_up_on_once_and_keeps_its_state() -> None:
    m = LaunchMachine(ready_limit=ReadyLimit(60.0))
    m.started(100, T0, T0)
    _feed(m, STORY[:4], T0 + 1)
    assert m.tick(T0 + 61) == []                # no health answer yet: not judged
    _unhealthy(m, T0 + 61)
    assert m.tick(T0 + 59) == []                # before the limit
    events = m.tick(T0 + 61.5)
    assert events == [ReadyTimedOut(ReadyLimit(60.0), State.LOADING, T0 + 61.5)]
    assert m.state is State.LOADING and m.timed_out == events[0]
    assert m.tick(T0 + 62) == []                # once
    assert not [e for e in m.tick(T0 + 500) if isinstance(e, ReadyTimedOut)]


def test_a_ready_server_attached_to_after_its_ready_timeout_is_not_given_up_on() -> None:
    m = LaunchMachine(ready_limit=ReadyLimit(60.0, kill=True))
    m.started(100, T0, T0 + 3600)               # attached an hour after its launch
    assert m.tick(T0 + 3600.5) == []            # the health probe has not answered yet
    for path in m.health_paths:
        m.feed_health(Health(True, path, 200, T0 + 3601), T0 + 3601)
    assert m.state is State.READY and m.tick(T0 + 3602) == []


def test_wait_timeout_in_its_place_counts_from_when_watching_began() -> None:
    m = LaunchMachine(ready_limit=ReadyLimit(10.0, "--timeout", from_launch=False))
    m.started(100, T0, T0 + 100)                # attached 100 s after the launch
    _unhealthy(m, T0 + 100)
    assert m.tick(T0 + 109) == []
    timed_out = m.tick(T0 + 110)
    assert [e.limit.name for e in timed_out if isinstance(e, ReadyTimedOut)] == ["--timeout"]


def test_a_worker_killed_while_serving_is_not_explained_by_its_survivors_errors() -> None:
    """The agent saw the worker end by SIGKILL; the engine core's `Executor failed.` and a
    peer's broken pipe are what its death did to them: no cause of its own, so the death says
    the signal (tui.core.describe), as `explain` does from the log (issue 33)."""
    core = "(EngineCore_DP0 pid=200) ERROR 06-01 10:12:41 [core.py:710] "
    after = [f"{core}EngineCore encountered a fatal error.",
             f"{core}Traceback (most recent call last):",
             f'{core}  File "/v/vllm/v1/executor/multiproc_executor.py", line 240, in rpc',
             f"{core}RuntimeError: Executor failed.",
             "(VllmWorker-2 pid=304) ERROR 06-01 10:12:41 [multiproc_executor.py:610] "
             "BrokenPipeError: [Errno 32] Broken pipe"]
    for log_first in (False, True):  # the agent's exit is mostly faster than the log tail
        m = _machine()
        _feed(m, STORY[:3], T0 + 1)  # a start-up ERROR it survived (Triton's import)
        m.feed_health(Health(True, "/v1/models", 200, T0 + 29), T0 + 29)
        m.feed_health(Health(True, "/health", 200, T0 + 30), T0 + 30)
        _feed(m, [SERVING_LINE], T0 + 60)
        exit_ = ProcExit(303, "VllmWorker-1", None, 9, T0 + 3600, False)
        if log_first:
            m.feed_lines([(10_000 + i, line) for i, line in enumerate(after)], T0 + 3600)
        events = m.feed_exit(exit_, T0 + 3600)
        if not log_first:
            events += m.feed_lines([(10_000 + i, line) for i, line in enumerate(after)],
                                   T0 + 3601)
        assert any(isinstance(e, Died) for e in events)
        assert m.death is not None and m.death.signal == 9 and m.death.cause is None, log_first
        assert death_lines(m.death)[1].startswith("root cause: killed by SIGKILL from outside")


SERVING_LINE = ("(APIServer pid=100) INFO 12-02 11:00:00 [loggers.py:123] Engine 000: Avg prompt "
                "throughput: 512.0 tokens/s, Avg generation throughput: 80.0 tokens/s, Running: 4 "
                "reqs, Waiting: 0 reqs")


def test_an_error_read_before_a_signal_death_may_be_why_it_was_killed() -> None:
    """A script that fails and then kills its child: the child, ended by SIGKILL, wrote
    nothing; the error read before its death (since READY) is the cause."""
    m = _machine()
    _feed(m, ["Traceback (most recent call last):", '  File "/srv/x.py", line 1, in <module>',
              "ValueError: boom"], T0 + 5)
    events = m.feed_exit(ProcExit(303, "EngineCore", None, 9, T0 + 6, False), T0 + 6)
    death = next(e for e in events if isinstance(e, Died)).death
    assert death.cause is not None and death.cause.line == "ValueError: boom"
