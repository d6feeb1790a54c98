"""The agent names processes on the GPU host with its own copy of the table the rest of tui reads
(tui/core/procnames.py): the two must say the same, or a process the agent names is not known
for what it is (a server role, SGLang's launcher, the top process)."""

from __future__ import annotations

import pytest

from tui.agent import names
from tui.core import procnames
from tui.core.procnames import ROLE_BY_COMMAND, is_server_role, top_name, untitled


def test_the_agent_and_the_core_strip_the_same_titles() -> None:
    assert tuple(title for title, _ in names.ENGINE_TITLES) == procnames.ENGINE_TITLES
    assert procnames.SGLANG_TITLE in procnames.ENGINE_TITLES


def test_the_agent_and_the_core_name_the_top_process_alike() -> None:
    assert names.TOP_NAMES == procnames.TOP_NAMES


def test_the_agent_and_the_core_know_sglangs_launcher_by_the_same_commands() -> None:
    assert names.SGLANG_LAUNCHER == procnames.SGLANG_LAUNCHER
    by_command = dict(ROLE_BY_COMMAND)
    assert all(by_command[command] == top_name("sglang") for command in names.SGLANG_LAUNCHER)


@pytest.mark.parametrize(("argv", "comm", "top"), [
    (["vllm", "serve", "/models/m"], "vllm", True),
    (["python", "-m", "vllm.entrypoints.openai.api_server"], "python", True),
    (["python", "-m", "sglang.launch_server", "--model-path", "m"], "python", True),
    (["python", "-m", "tui.sim.engine", "--sim-engine", "sglang"], "python", True),
    (["VLLM::EngineCore_DP0"], "VLLM::EngineCor", False),
    (["VLLM::Worker_TP3"], "VLLM::Worker_TP", False),
    (["sglang::scheduler_TP3"], "sglang::schedul", False),
    (["sglang::detokenizer"], "sglang::detoken", False),
    (["python", "-c", "from multiprocessing.spawn import spawn_main"], "python", False),
])
def test_every_server_process_the_agent_names_is_a_server_role_to_the_core(
        argv: list[str], comm: str, top: bool) -> None:
    assert is_server_role(names.vllm_name(argv, comm, top))


@pytest.mark.parametrize(("argv", "engine"), [
    (["vllm", "serve", "/models/m"], "vllm"),
    (["python", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
    (["python", "-m", "tui.sim.engine", "--sim-engine", "sglang", "--model-path", "m"], "sglang"),
    (["python", "-m", "tui.sim.engine", "serve", "m"], "vllm"),
])
def test_the_agent_names_the_top_process_as_the_core_does(argv: list[str], engine: str) -> None:
    assert names.vllm_name(argv, "python", True) == top_name(engine)


@pytest.mark.parametrize(("title", "short"), [
    ("VLLM::EngineCore_DP0", "EngineCore_DP0"), ("sglang::scheduler_TP3", "scheduler_TP3"),
])
def test_a_title_is_stripped_to_the_name_the_agent_gives(title: str, short: str) -> None:
    assert untitled(title) == short == names.vllm_name([title], "python", False)


def test_a_name_without_a_title_stays_as_it_is() -> None:
    assert untitled("APIServer") == "APIServer"
