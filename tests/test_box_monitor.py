"""The container monitor's ways out (tui/agent/boxmonitor.py), each ending in exit.json with
the reason in one line: an error of any kind, a kill while the container starts, a `run -d`
that times out, a `docker wait` that fails while the container dies with its daemon; and the
agent's calls that a Python 3.10 host must accept. The runtime here is a script standing in
for the docker CLI (its calls logged); the real daemon's restart is the container lane's."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tui.agent import boxmonitor, container
from tui.agent.boxmonitor import BoxMonitor
from tui.agent.container import Box, Pull
from tui.agent.rundir import STARTING
from tui.agent.wire import AgentFailure

AGENT = Path(__file__).resolve().parent.parent / "tui" / "agent"

# a docker CLI: `inspect` answers from the state files in turn (the last one stays), `wait`
# fails as a client whose daemon went away does
FAKE_DOCKER = """#!/bin/sh
dir=$(dirname "$0")
echo "$@" >> "$dir/calls"
case "$1" in
  ps) ;;
  image) exit 0;;
  run) echo c0ffee;;
  version) echo 28.2.2;;
  wait) echo 'error during connect: unexpected EOF' >&2; exit 1;;
  inspect)
    n=$(cat "$dir/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$dir/n"
    f="$dir/state$n"; [ -f "$f" ] || f=$(ls "$dir"/state* | sort | tail -n 1)
    cat "$f";;
  rm) ;;
esac
"""


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(boxmonitor, "RETRY_S", 0.01)
    return bin_dir


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing in for the container's main process on the host."""
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def term_handler() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _monitor(run_dir: Path, env: dict[str, str] | None = None,
             secret_env: tuple[str, ...] = ()) -> BoxMonitor:
    run_dir.mkdir(exist_ok=True)
    (run_dir / "server.log").touch()
    box = Box({"runtime": "docker", "name": "specconsole-r", "image": "img", "options": [],
               "command": [], "profile_label": "specconsole.profile=p",
               "entrypoint": "command", "secret_env": list(secret_env)})
    # the monitor's environment is the server's: the host's, PATH included
    return BoxMonitor(box, str(run_dir), ["serve"], {"PATH": os.environ["PATH"], **(env or {})})


def _state(docker: Path, n: int, **state: object) -> None:
    (docker / f"state{n}").write_text(json.dumps(state))


def _exit(run_dir: Path) -> dict:
    return json.loads((run_dir / "exit.json").read_text())


def test_an_error_of_any_kind_ends_the_run_in_one_line(
        tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(box: Box) -> bool:
        raise ValueError("a bug\nover two lines")
    monkeypatch.setattr(container, "image_present", broken)
    run_dir = tmp_path / "run"
    _monitor(run_dir).run()
    ended = _exit(run_dir)
    assert ended["error"] == "the container's monitor failed: ValueError: a bug over two lines"
    assert ended["code"] == 127 and ended["pid"] is None
    assert json.loads((run_dir / "pid").read_text())["pid"] is None
    assert not (run_dir / STARTING).exists()


def test_a_failed_wait_is_asked_again_and_a_daemon_restart_is_told_in_words(
        tmp_path: Path, docker: Path, sleeper: subprocess.Popen[bytes]) -> None:
    _state(docker, 0, Running=True, Pid=sleeper.pid, StartedAt="t0", ExitCode=0)
    _state(docker, 1, Running=False, Pid=0, StartedAt="t0", ExitCode=137, OOMKilled=False)
    run_dir = tmp_path / "run"
    monitor = _monitor(run_dir)
    monitor.run()
    assert json.loads((run_dir / "pid").read_text())["pid"] == sleeper.pid
    ended = _exit(run_dir)
    assert ended["code"] == 137 and ended["pid"] == sleeper.pid
    assert ended["error"] == ("the docker daemon restarted; the container died with it (exit "
                              "code 137)")
    assert (run_dir / "server.log").read_text() == ""  # the monitor says it on its fd 2


def test_a_kill_while_the_container_starts_leaves_none_up(
        tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    monitor = _monitor(run_dir)
    real = container.cli

    def cli(runtime: str, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        if args[0] == "run":  # the kill's TERM comes while `run -d` is under way
            assert json.loads((run_dir / STARTING).read_text())["monitor_pid"] == os.getpid()
            monitor._on_term()
        return real(runtime, *args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(container, "cli", cli)
    monitor.run()
    ended = _exit(run_dir)
    assert ended["error"] == "killed while starting container specconsole-r"
    assert ended["signal"] == signal.SIGTERM and ended["pid"] is None
    assert "rm -f specconsole-r" in (docker / "calls").read_text().splitlines()
    assert not (run_dir / STARTING).exists()


def test_a_run_that_times_out_removes_what_it_made(
        tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = container.cli

    def cli(runtime: str, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        if args[0] == "run":
            raise AgentFailure("container", "`docker run` did not answer in 300 s: is its "
                               "daemon running?")
        return real(runtime, *args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(container, "cli", cli)
    run_dir = tmp_path / "run"
    _monitor(run_dir, {"HF_TOKEN": "hf_x"}, ("HF_TOKEN",)).run()
    assert "did not answer in 300 s" in _exit(run_dir)["error"]
    assert "rm -f specconsole-r" in (docker / "calls").read_text().splitlines()
    assert not (run_dir / container.SECRETS).exists()  # the secrets file is gone too


def test_secret_values_go_by_file_never_to_the_runtime_client(
        tmp_path: Path, docker: Path, sleeper: subprocess.Popen[bytes],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's environment and argv hold no secret value; the file the wrapper reads
    is there while `run -d` runs (mode 0600) and gone when it returned."""
    _state(docker, 0, Running=False, Pid=sleeper.pid, StartedAt="t0", ExitCode=0)
    seen: dict[str, object] = {}
    real = container.cli

    def cli(runtime: str, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        if args[0] == "run":
            held = Path(tmp_path / "run" / container.SECRETS)
            seen.update(env=kw.get("env"), argv=args, mode=held.stat().st_mode & 0o777,
                        text=held.read_text())
        return real(runtime, *args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(container, "cli", cli)
    monkeypatch.setattr(container, "wait", lambda runtime, name: 0)
    run_dir = tmp_path / "run"
    _monitor(run_dir, {"HF_TOKEN": "hf_secret", "PLAIN": "1"}, ("HF_TOKEN",)).run()
    assert seen["mode"] == 0o600 and seen["text"] == "HF_TOKEN=hf_secret\n"
    client = seen["env"]
    assert isinstance(client, dict) and client["PLAIN"] == "1" and "HF_TOKEN" not in client
    assert not any("hf_secret" in w for w in seen["argv"])  # type: ignore[union-attr]
    assert not (run_dir / container.SECRETS).exists()
    assert _exit(run_dir)["code"] == 0


def test_the_pull_starts_on_a_python_310_host(
        tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.10's Popen has no process_group (a TypeError there): the pull asks for its
    own group the way the host's Python can."""
    monkeypatch.setattr(sys, "version_info", (3, 10, 12, "final", 0))
    real = subprocess.Popen

    class Popen310(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kw: object) -> None:
            if "process_group" in kw:
                raise TypeError("__init__() got an unexpected keyword argument "
                                "'process_group'")
            super().__init__(*args, **kw)
    monkeypatch.setattr(subprocess, "Popen", Popen310)
    (docker / "docker").write_text("#!/bin/sh\necho 'abcdef012345: Pull complete'\n")
    box = Box({"runtime": "docker", "name": "n", "image": "img", "options": [], "command": [],
               "profile_label": "specconsole.profile=p"})
    read, write = os.pipe()
    saved = os.dup(1)
    os.dup2(write, 1)
    try:
        Pull(box).run()
    finally:
        os.dup2(saved, 1)
        os.close(write)
    said = os.read(read, 65536).decode()
    os.close(read)
    assert "abcdef012345: Pull complete" in said and "1/1 layers" in said


def test_the_agent_passes_no_311_only_argument_outside_its_one_guard() -> None:
    """`process_group=` (3.11+) appears in no call of the agent: procfs.own_group decides."""
    found = []
    for path in sorted(AGENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and any(k.arg == "process_group"
                                                  for k in node.keywords):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
