"""The names vLLM and SGLang give their processes: the one table the rest of tui reads.

tui/agent/names.py names the processes on the GPU host and keeps its own copy of the shared part
(the agent imports nothing of tui); tests/test_procnames.py keeps the two equal.
"""

from __future__ import annotations

import re

# Titles (setproctitle) that carry the process's own name after the prefix:
# `VLLM::EngineCore_DP0` is "EngineCore_DP0", `sglang::scheduler_TP3` is "scheduler_TP3".
ENGINE_TITLES = ("VLLM::", "sglang::")
SGLANG_TITLE = "sglang::"
# The top process of a run (the server that answers HTTP), by engine.
TOP_NAMES = {"vllm": "APIServer", "sglang": "SGLangServer"}
# SGLang's launcher by its command line: the real one, and the simulated engine playing it.
SGLANG_LAUNCHER = ("sglang.launch_server", "--sim-engine sglang")
# Processes that log nothing under their own prefix, named by their command line: vLLM's model
# inspection child, SGLang's launcher (no SGLang line names its process by pid).
ROLE_BY_COMMAND = (("vllm.model_executor.models.registry", "model inspection"),
                   *((command, TOP_NAMES["sglang"]) for command in SGLANG_LAUNCHER))

# vLLM's (and SGLang's) own processes: their death is the server's death, whatever the code.
# "EngineCor": the kernel keeps 15 characters of `VLLM::EngineCore` as a zombie's name, as
# "schedul" and "detoken" of `sglang::scheduler_TP3` and `sglang::detokenizer`.
_SERVER_ROLE = re.compile(
    r"^(APIServer|EngineCor|VllmWorker|Worker|RayWorkerWrapper|mp-spawn|vllm|sglang|SGLang"
    r"|Scheduler|schedul|detoken|data_parallel)",
)
# Shells: a command one runs is a step of its script (see is_shell).
_SHELLS = r"sh|bash|dash|zsh|ksh|busybox"
_SHELL = re.compile(rf"^({_SHELLS})$")
# Helpers that come and go during a launch (compilers, shells, the multiprocessing resource
# tracker): even a failing one is reported, not taken for the server's death.
_HELPER = re.compile(r"^(resource_tracker|g\+\+|c\+\+|gcc|cc1plus|cc1|as|ld|collect2|ninja|make"
                     rf"|{_SHELLS}|nvcc|ptxas|cicc|fatbinary|nvlink)$")


def is_server_role(name: str) -> bool:
    """One of vLLM's (or SGLang's) own processes, by the name the log or the kernel gives it."""
    return _SERVER_ROLE.match(name) is not None


def is_helper(name: str) -> bool:
    """A helper of the launch (compiler, shell, resource tracker), by its kernel name."""
    return _HELPER.match(name) is not None


def is_shell(name: str) -> bool:
    """A shell, by its kernel name: what it runs (`readlink`, `grep -q`) may fail by design."""
    return _SHELL.match(name) is not None


def top_name(engine: str) -> str:
    """The top process's name when nothing better is known (attached after it was gone)."""
    return TOP_NAMES["sglang"] if engine == "sglang" else TOP_NAMES["vllm"]


def untitled(name: str) -> str:
    """A process's name without its engine's title prefix: `VLLM::EngineCore_DP0` ->
    "EngineCore_DP0", as the log's prefixes name it."""
    for prefix in ENGINE_TITLES:
        name = name.removeprefix(prefix)
    return name
