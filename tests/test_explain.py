"""Post-mortem of whole logs: outcome, furthest phase, root cause, what the noise rules hid."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tui.core.explain import explain, explain_file, explanation_lines
from tui.core.failures import by_id, exit_signal
from tui.core.noise import rule_from_pattern
from tui.core.phases import Phase
from tui.core.ranking import SURVIVED_WORDS, shape

FIXTURES = Path(__file__).parent / "fixtures"
KIMI = "/root/.cache/huggingface/modules/transformers_modules/moonshotai/Kimi-K2.5/kimi_k25.py"
HEARTBEAT = ("(EngineCore_DP0 pid=2903) INFO 09-30 14:20:41 [shm_broadcast.py:466] No available "
             "shared memory broadcast block found in 60 seconds. This typically happens when some "
             "processes are hanging or doing some time-consuming work (e.g. compilation, "
             "weight/kv cache quantization).")


def fixture(name: str) -> list[str]:
    # split on "\n" only: tqdm's "\r" redraws are part of their line
    return (FIXTURES / name).read_bytes().decode().split("\n")[:-1]


READY = fixture("vllm-startup-ready.log")
CRASH = fixture("vllm-crash-syntaxerror.log")


def test_eagle3_tp8_startup_is_ready() -> None:
    result = explain(READY)
    assert result.outcome == "ready"
    assert result.last_phase is Phase.SERVING
    assert result.root_cause is None and result.symptoms == ()
    # line 112, `127.0.0.1:40112 - "GET /health …" 200`: a probe of specconsole's own
    assert result.hidden == {"future-warning": 10, "mq-handle": 1, "deprecated": 1, "blank": 1,
                             "specconsole-probe": 1}


def test_the_story_crash() -> None:
    result = explain(CRASH)
    assert result.outcome == "crashed"
    assert result.last_phase is Phase.CONFIG
    assert result.root_cause is not None
    assert result.root_cause.line == f"SyntaxError: invalid syntax ({KIMI}, line 12)"
    assert result.root_cause.process == "EngineCore_DP0"
    assert result.symptoms == (
        "EngineCore failed to start.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {'EngineCore_DP0': 1}",
    )
    assert result.hidden["syntax-warning-escape"] == 1
    assert result.hidden["syntax-warning-escape-source"] == 1
    assert result.hidden["destroy-process-group"] == 1
    assert "triton-kernels-import" not in result.hidden  # harmless is shown, not hidden


def test_to_json_schema() -> None:
    data = explain(CRASH).to_json()
    # the schema grew (issue 15): a cause's class and hint, a cut traceback, per-service verdicts
    # ... and a runner-up when the ranking was not sure (issue 28), the requests that failed
    # while serving (issue 33)
    assert list(data) == ["outcome", "last_phase", "root_cause", "runner_up", "failed_requests",
                          "symptoms", "hidden", "services"]
    assert data["runner_up"] is None and data["failed_requests"] is None
    assert data["outcome"] == "crashed" and data["last_phase"] == "config"
    assert data["root_cause"] == {
        "line": f"SyntaxError: invalid syntax ({KIMI}, line 12)", "process": "EngineCore_DP0",
        "missing": False, "deepest_frame": None, "class": "syntax",
        "hint": by_id("syntax").hint}
    assert json.loads(json.dumps(data)) == data
    assert explain(READY).to_json()["root_cause"] is None
    assert explain([]).to_json() == {"outcome": "unknown", "last_phase": None, "root_cause": None,
                                     "runner_up": None, "failed_requests": None,
                                     "symptoms": [], "hidden": {},
                                     "services": None}


# Two reports of a failure elsewhere and nothing else: the first is named, the second shown as
# the runner-up (a user shown two loses a second; shown the wrong one loses the night).
ELSEWHERE_ONLY = [
    "Traceback (most recent call last):",
    '  File "/venv/ray/_private/worker.py", line 2771, in get',
    "    raise value",
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    "INFO 12-03 08:18:45 [registry.py:1120] inspecting the model in a subprocess",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.12/subprocess.py", line 571, in run',
    "    raise CalledProcessError(retcode, process.args,",
    "subprocess.CalledProcessError: Command '['python3', '-m', 'inspect']' returned non-zero "
    "exit status 1.",
]


def test_a_cause_that_only_reports_a_failure_elsewhere_comes_with_its_runner_up() -> None:
    result = explain(ELSEWHERE_ONLY)
    assert result.outcome == "crashed"
    assert result.root_cause is not None and result.root_cause.line.startswith(
        "ray.exceptions.ActorDiedError")
    assert result.runner_up is not None
    assert result.runner_up.line.startswith("subprocess.CalledProcessError")
    said = explanation_lines(result)
    assert any(line.startswith("runner-up:     subprocess.CalledProcessError") for line in said)
    assert any("(considered: " in line for line in said)
    data = result.to_json()["runner_up"]
    assert data["line"].startswith("subprocess.CalledProcessError") and data["reasons"]


def test_a_clear_cause_has_no_runner_up() -> None:
    """The story's SyntaxError beats the symptoms and the Triton noise by the tiers' rule."""
    result = explain(CRASH)
    assert result.runner_up is None
    assert not any(line.startswith("runner-up:") for line in explanation_lines(result))


WRAPPERS: list[Callable[[str], str]] = [
    lambda s: f"vllm-1  | {s}",
    lambda s: f"2026-03-02T09:14:33.123456789Z {s}",
    lambda s: f"[2026-03-02T09:14:33Z] {s}",
    lambda s: f"09:14:33 [INFO] [inf-job] [INFERENCE LOG] {s}",
    lambda s: f"Mar  2 09:14:33 gpu-7 vllm[88]: {s}#015",
]


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("name", ["vllm-startup-ready.log", "vllm-crash-syntaxerror.log"])
def test_wrapped_logs_explain_the_same(wrap: Callable[[str], str], name: str) -> None:
    lines = fixture(name)
    assert explain(wrap(s) for s in lines).to_json() == explain(lines).to_json()


@pytest.mark.parametrize(("cut_after", "phase"), [
    ("Loading safetensors checkpoint shards", Phase.WEIGHTS),
    ("Dynamo bytecode transform time", Phase.COMPILE),
    ("GPU KV cache size", Phase.KV_CACHE),
])
def test_a_log_that_stops_mid_phase(cut_after: str, phase: Phase) -> None:
    end = next(i for i, s in enumerate(READY) if cut_after in s) + 1
    unknown = explain(READY[:end])
    assert (unknown.outcome, unknown.last_phase) == ("unknown", phase)
    hung = explain([*READY[:end], HEARTBEAT, HEARTBEAT])
    assert (hung.outcome, hung.last_phase) == ("hung", phase)


def test_ready_then_port_bind_failure_is_a_crash() -> None:
    result = explain([*READY[:READY.index(next(s for s in READY if "startup complete" in s)) + 1],
                      "(APIServer pid=2741) ERROR:    [Errno 98] error while attempting to bind on "
                      "address ('0.0.0.0', 8000): address already in use"])
    assert result.outcome == "crashed"
    assert result.root_cause is not None and "[Errno 98]" in result.root_cause.line


def test_engine_death_while_serving() -> None:
    result = explain([*READY,
                      "(APIServer pid=2741) ERROR 09-30 14:09:00 [core_client.py:564] Engine core "
                      "proc EngineCore_DP0 died unexpectedly, shutting down client.",
                      "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
                      "issue. See stack trace (above) for the root cause."])
    assert result.outcome == "crashed" and result.last_phase is Phase.SERVING
    assert result.root_cause is None and len(result.symptoms) == 2


def test_serving_survives_a_request_error() -> None:
    stats = next(s for s in READY if "Avg prompt throughput" in s)
    result = explain([*READY, "(APIServer pid=2741) ERROR 09-30 14:06:00 [serving_chat.py:1] "
                      "ValueError: prompt too long", stats])
    assert result.outcome == "ready" and result.root_cause is None


def test_a_warning_traceback_during_load_is_not_a_crash() -> None:
    end = next(i for i, s in enumerate(READY) if "Starting to load model" in s)
    warning = ["(Worker_TP0 pid=3011) WARNING 09-30 14:02:42 [dynamic_module.py:51] Traceback "
               "(most recent call last):",
               "(Worker_TP0 pid=3011) WARNING 09-30 14:02:42 [dynamic_module.py:51]   File "
               "\"/x.py\", line 1, in <module>",
               "(Worker_TP0 pid=3011) WARNING 09-30 14:02:42 [dynamic_module.py:51] "
               "ImportError: optional thing missing"]
    result = explain([*READY[:end], *warning, *READY[end:]])
    assert result.outcome == "ready"
    # a log that ends there shows no crash (a WARNING is no evidence; real logs labelled so,
    # tests/corpus), but names what it saw
    cut = explain([*READY[:end], *warning])
    assert cut.outcome == "unknown" and cut.root_cause is not None
    assert cut.root_cause.line == "ImportError: optional thing missing"


def test_extra_rules_count_in_hidden_and_come_first() -> None:
    rules = [rule_from_pattern("hide:routes", "hide", r"^Route: ", "route list")]
    result = explain(READY, extra_rules=rules)
    assert result.hidden["hide:routes"] == 7
    assert result.outcome == "ready"


@pytest.mark.parametrize(("text", "said"), [
    ("Exception: Server process exited with code -9. Check server logs for errors.",
     "exit code -9: SIGKILL, killed from outside"),
    ("RuntimeError: worker exited with exit code 135", "exit code 135 = 128+7: SIGBUS, a bus "
     "error"),
    ("subprocess.CalledProcessError: Command 'x' returned non-zero exit status 1.", None),
    ("Process ended with exitcode=-6", "exit code -6: SIGABRT, aborted"),
])
def test_an_exit_status_that_means_a_signal_is_named(text: str, said: str | None) -> None:
    named = exit_signal(text)
    assert (named is None) if said is None else (named is not None and named.startswith(said))


def test_explain_names_the_signal_behind_an_exit_code() -> None:
    lines = explanation_lines(explain([
        "ERROR 12-03 08:18:44 [engine.py:1] RuntimeError: Worker process exited with code 135"]))
    assert "exit status:   exit code 135 = 128+7: SIGBUS, a bus error (an unreadable " \
           "memory-mapped file such as a checkpoint on a failing disk, or a /dev/shm too small " \
           "for NCCL)" in lines


# An ERROR a good launch of the profile also logged (numbers aside) is no cause while another
# is known: the Triton-import class, learned per profile from the launch history.
PLUGIN = ("Failed to load plugin vllm_ext_{n}: ImportError: libext.so.{n}: cannot open shared "
          "object file")
LATER_CAUSE = [
    f"(APIServer pid=41) ERROR 12-03 08:18:40 [__init__.py:41] {PLUGIN.format(n=12)}",
    "(APIServer pid=41) INFO 12-03 08:18:41 [api_server.py:1] loading the model",
    "Traceback (most recent call last):",
    '  File "/venv/vllm/config.py", line 12, in verify',
    "    raise ValueError(msg)",
    "ValueError: max_model_len 262144 is larger than the model's 131072",
]


def test_an_error_a_good_launch_survived_gives_way_to_the_real_cause(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join(LATER_CAUSE) + "\n")
    alone = explain_file(log)
    assert alone.root_cause is not None and alone.root_cause.line.startswith("Failed to load")
    survived = frozenset({shape(PLUGIN.format(n=7))})  # another launch: other numbers
    ex = explain_file(log, survived=survived)
    assert ex.root_cause is not None and ex.root_cause.line.startswith("ValueError: max_model")
    assert ex.runner_up is not None and ex.runner_up.line.startswith("Failed to load plugin")
    assert ex.runner_up.reasons == (SURVIVED_WORDS,)
