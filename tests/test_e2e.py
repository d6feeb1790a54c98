"""End to end: the `specconsole` command against the simulated engine, locally and over SSH.

Real processes, real signals, a real SSH server (asyncssh, in-process) that executes what it
receives. The simulated worker writes the moment of its death, so latency is measured from it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import carriers, free_port, sim_profile, wait_for

from tui.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


async def _acli(*args: str, env: dict[str, str], timeout: float = 60
                ) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess while this event loop keeps serving the in-process SSH server."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui", *args, cwd=ROOT, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return subprocess.CompletedProcess(list(args), proc.returncode or 0, out.decode(),
                                       err.decode())



def _run_id(stdout: str) -> str:
    for line in stdout.splitlines():
        if " run " in line:
            return line.split(" run ", 1)[1].split()[0]
    raise AssertionError(f"no run id in {stdout!r}")


def test_help_lists_every_subcommand_in_one_line_each() -> None:
    out = _cli("--help", env={"COLUMNS": "80"}).stdout
    lines = out.splitlines()
    subs = COMMANDS
    for sub in subs:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(sub + " "))
        following = lines[at + 1].strip()  # the next line is another subcommand, not a wrap
        assert following.split(" ")[0] in (*subs, "") or following.startswith("options"), sub


def _assert_ready_then_killed(profile: Path, result: subprocess.CompletedProcess[str],
                              status: subprocess.CompletedProcess[str],
                              killed: subprocess.CompletedProcess[str], run_id: str) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "READY after" in result.stdout
    phases = [line.split("phase: ", 1)[1].split(" (at")[0] for line in result.stdout.splitlines()
              if "phase: " in line]
    assert phases[:3] == ["launching", "reading config", "loading weights"]
    assert run_id in status.stdout and "alive" in status.stdout
    # once at READY, and in status for the READY run: the server's own figures (its /metrics)
    serving = [line for line in result.stdout.splitlines() if "serving: " in line]
    assert len(serving) == 1 and "running ·" in serving[0] and "KV cache" in serving[0], serving
    assert "serving: " in status.stdout and "running ·" in status.stdout, status.stdout
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "no process of the run remains" in killed.stdout
    assert "GPU memory released" in killed.stdout
    assert carriers(run_id) == []


def test_demo_profile_reaches_ready_then_kill_leaves_nothing(tmp_path: Path, cleanup) -> None:
    profile = sim_profile(tmp_path, "ready", time_scale=300)
    result = _cli("wait", str(profile), "--launch", "--timeout", "60s")
    run_id = _run_id(result.stdout)
    cleanup.append(run_id)
    assert carriers(run_id), "the server must outlive the `wait` command"
    status = _cli("status", str(profile))
    killed = _cli("kill", str(profile), "--grace", "5")
    _assert_ready_then_killed(profile, result, status, killed, run_id)


def _wait_json(profile: Path, cleanup: list[str]
               ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`wait --launch --json` on a simulated run: the result and its records."""
    result = _cli("wait", str(profile), "--launch", "--timeout", "60s", "--json")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    cleanup.append(records[0]["run_id"])
    return result, records


def test_wait_json_gives_the_serving_figures_once_at_ready(tmp_path: Path, cleanup) -> None:
    profile = sim_profile(tmp_path, "ready", time_scale=300)
    result, records = _wait_json(profile, cleanup)
    assert result.returncode == 0, result.stdout + result.stderr
    serving = [r for r in records if "serving" in r]
    assert len(serving) == 1 and serving[0]["msg"].startswith("serving: ")
    figures = serving[0]["serving"]
    assert figures["running"] >= 1 and 0 <= figures["kv_usage"] <= 1, figures
    assert _cli("kill", str(profile), "--grace", "5").returncode == 0


async def test_ready_over_ssh_then_kill_leaves_nothing(tmp_path: Path, ssh_server,
                                                      cleanup) -> None:
    profile = sim_profile(tmp_path, "ready", target=ssh_server.alias, time_scale=300)
    result = await _acli("wait", str(profile), "--launch", "--timeout", "60s",
                         env=ssh_server.env)
    run_id = _run_id(result.stdout)
    cleanup.append(run_id)
    assert carriers(run_id), "the server must outlive the SSH session"
    status = await _acli("status", str(profile), env=ssh_server.env)
    killed = await _acli("kill", str(profile), "--grace", "5", env=ssh_server.env)
    _assert_ready_then_killed(profile, result, status, killed, run_id)


# a host whose shell start-up greets in colour, sets the terminal's title and writes markup
NOISY = b"\x1b]0;pwned\x07\x1b[1;31m[bold]Welcome[/bold] to gpu1 [/]\x1b[0m\x1b[2J\n"


async def test_a_noisy_host_never_drives_the_terminal(tmp_path: Path, ssh_server,
                                                      cleanup) -> None:
    ssh_server.startup = NOISY
    where = tmp_path / "runs [x]"  # the run dir's path holds brackets too
    where.mkdir()
    profile = sim_profile(where, "ready", target=ssh_server.alias, time_scale=300)
    waited = await _acli("wait", str(profile), "--launch", "--timeout", "60s",
                         env=ssh_server.env)
    cleanup.append(_run_id(waited.stdout))
    assert waited.returncode == 0, waited.stdout + waited.stderr
    status = await _acli("status", str(profile), env=ssh_server.env)
    killed = await _acli("kill", str(profile), "--grace", "5", env=ssh_server.env)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    broken = where / "python-that-fails"  # the agent's last stderr line is the host's noise
    broken.write_bytes(b"#!/bin/sh\nprintf '" + NOISY.replace(b"\x1b", b"\\033")
                       .replace(b"\x07", b"\\007").replace(b"\n", b"\\n") + b"' >&2\nexit 1\n")
    broken.chmod(0o755)
    profile.write_text(profile.read_text().replace(f'python = "{sys.executable}"',
                                                   f'python = "{broken}"'))
    refused = await _acli("check", str(profile), env=ssh_server.env)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "[bold]Welcome[/bold] to gpu1 [/]" in refused.stderr  # the words, as text
    for result in (waited, status, killed, refused):
        assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stderr


def test_missing_remote_python_is_one_line_with_the_fix(tmp_path: Path) -> None:
    profile = sim_profile(tmp_path, "ready")
    profile.write_text(profile.read_text().replace(f'python = "{sys.executable}"',
                                                   'python = "/nonexistent/bin/python3"'))
    result = _cli("wait", str(profile), "--launch")
    assert result.returncode == 1
    assert "/nonexistent/bin/python3" in result.stderr and "host.python" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_wait_on_a_running_profile_attaches_instead_of_launching(tmp_path: Path,
                                                                 cleanup) -> None:
    profile = sim_profile(tmp_path, "ready", time_scale=60)
    launched = _cli("launch", str(profile))
    assert launched.returncode == 0, launched.stderr
    run_id = _run_id(launched.stdout)
    cleanup.append(run_id)
    attached = _cli("wait", str(profile), "--timeout", "3s", "--json")
    first = json.loads(attached.stdout.splitlines()[0])
    assert first["attached"] is True and first["run_id"] == run_id
    assert attached.returncode == 4  # timeout: a 25-minute load at ×60 is not ready in 3 s
    assert len(list((tmp_path / "runs").iterdir())) == 1


async def test_story_over_ssh_dead_with_the_syntax_error(tmp_path: Path, ssh_server,
                                                         cleanup) -> None:
    # how soon the death is said: tests/bench/death.py
    profile = sim_profile(tmp_path, "syntax-error", target=ssh_server.alias, time_scale=75)
    result = await _acli("wait", str(profile), "--launch", "--timeout", "60s", env=ssh_server.env)
    assert result.returncode == 3, result.stdout + result.stderr
    cleanup.append(_run_id(result.stdout))
    dead_line = next(line for line in result.stdout.splitlines() if "DEAD:" in line)
    assert "Worker_TP" in dead_line and "exit code 1" in dead_line
    cause = next(line for line in result.stdout.splitlines() if "root cause" in line)
    assert "SyntaxError" in cause and "kimi_k25_patched.py, line 15" in cause
    assert "Engine core initialization failed" not in cause
    assert "Triton" not in cause


def test_bad_profile_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[host]\ntarget = "local"\n[server]\nengine = "vllm"\nmodel = "m"\n'
                   "tensor_paralel_size = 8\n")
    result = _cli("wait", str(bad), "--launch")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "bad.toml:6" in result.stderr and "tensor_parallel_size" in result.stderr


async def test_unknown_ssh_host_key_is_refused_with_the_fix(tmp_path: Path,
                                                            ssh_server) -> None:
    Path(ssh_server.known_hosts).write_text("")
    profile = sim_profile(tmp_path, "ready", target=ssh_server.alias)
    result = await _acli("wait", str(profile), "--launch", env=ssh_server.env)
    assert result.returncode == 1
    assert "host key unknown" in result.stderr and "ssh-keyscan" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_secrets_never_reach_the_screen_or_the_run_dir(tmp_path: Path, cleanup) -> None:
    token = "hf_s3cr3t-VALUE-0123"
    profile = tmp_path / "secret.toml"
    profile.write_text(f"""
[host]
target = "local"
python = "{sys.executable}"
runs_dir = "{tmp_path / 'runs'}"

[server]
engine = "vllm"
port = {free_port()}
secret_env = ["SPECCONSOLE_TEST_TOKEN"]
command = ["sh", "-c", "echo token=$SPECCONSOLE_TEST_TOKEN; sleep 30"]

[preflight]
enabled = false
""")
    env = {"SPECCONSOLE_TEST_TOKEN": token}
    launched = _cli("launch", str(profile), env=env)
    assert launched.returncode == 0, launched.stderr
    run_id = _run_id(launched.stdout)
    cleanup.append(run_id)
    log = next((tmp_path / "runs").iterdir()) / "server.log"
    wait_for(lambda: log.exists() and b"token=" in log.read_bytes(), what="the server's line")
    logs = _cli("logs", str(profile), "--raw", env=env)
    assert "token=«redacted»" in logs.stdout and token not in logs.stdout
    elsewhere = _cli("logs", str(profile), "--raw")  # a shell without the secret: the agent
    assert "token=«redacted»" in elsewhere.stdout and token not in elsewhere.stdout  # knows it
    run_dir = next((tmp_path / "runs").iterdir())
    assert token not in (run_dir / "launch.json").read_text()
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    assert _cli("kill", str(profile), "--grace", "2", env=env).returncode == 0


def test_secrets_on_the_command_line_and_from_the_shell_reach_the_server_only(
        tmp_path: Path, cleanup) -> None:
    """`--api-key` in server.args (both forms) and an env value taken from the shell: in no
    output of launch, wait, status, logs, history, history --diff, check; nor in launch.json or
    the history database. The server still gets them."""
    key_a, key_b, token = "s3cr3t-KEY-a1b2c3d4", "s3cr3t-KEY-e5f6a7b8", "hf_FromTheShell-0987"
    data = tmp_path / "data"
    env = {"SPECCONSOLE_DATA_DIR": str(data), "SPECCONSOLE_TEST_HF": token}

    def profile_with(args: list[str]) -> Path:
        path = sim_profile(tmp_path, "ready", time_scale=1000)  # only READY matters here
        text = path.read_text().replace("[server]\n", f"[server]\nargs = {json.dumps(args)}\n", 1)
        path.write_text(text + '\n[server.env]\nHF_TOKEN = "${SPECCONSOLE_TEST_HF}"\n')
        return path

    profile = profile_with(["--api-key", key_a])
    first = _cli("wait", str(profile), "--launch", "--timeout", "60s", env=env)
    run_a = _run_id(first.stdout)
    cleanup.append(run_a)
    assert first.returncode == 0, first.stdout + first.stderr
    server = next(pid for pid in carriers(run_a)
                  if b"tui.sim.engine" in Path(f"/proc/{pid}/cmdline").read_bytes())
    assert key_a.encode() in Path(f"/proc/{server}/cmdline").read_bytes()  # as given
    assert f"HF_TOKEN={token}".encode() in Path(f"/proc/{server}/environ").read_bytes()
    outputs = [first, _cli("status", str(profile), env=env)]
    logs = _cli("logs", str(profile), "--raw", env=env)
    assert "'api_key': '«redacted»'" in logs.stdout  # the server printed it; shown hidden
    outputs += [logs, _cli("kill", str(profile), "--grace", "5", env=env)]
    profile = profile_with([f"--api-key={key_b}"])
    launched = _cli("launch", str(profile), env=env)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_b = _run_id(launched.stdout)
    cleanup.append(run_b)
    outputs += [launched, _cli("wait", str(profile), "--timeout", "60s", env=env),
                _cli("kill", str(profile), "--grace", "5", env=env),
                _cli("history", env=env)]
    changed = _cli("history", "--diff", run_a, run_b, env=env)
    assert "+--api-key=«redacted»" in changed.stdout, changed.stdout
    checked = _cli("check", str(profile), env=env)
    assert "--api-key on the command line is visible to every user of the host in `ps`" in \
        checked.stdout and 'secret_env = ["VLLM_API_KEY"]' in checked.stdout, checked.stdout
    assert 'server.env.HF_TOKEN looks like a secret' in checked.stdout
    outputs += [changed, checked]
    written = [p.read_bytes() for p in data.iterdir()]  # the database, its journal if any
    written += [p.read_bytes() for p in (tmp_path / "runs").glob("*/launch.json")]
    assert len(written) >= 3
    for secret in (key_a, key_b, token):
        for result in outputs:
            assert secret not in result.stdout + result.stderr, (secret, result.args)
        assert not any(secret.encode() in blob for blob in written), secret


def test_preflight_refuses_a_patched_file_with_a_syntax_error(tmp_path: Path) -> None:
    broken = tmp_path / "kimi_k25.py"
    broken.write_text("import torch\nfrom .deepseek_v2 import (DeepseekV2Model,\n")
    profile = sim_profile(tmp_path, "ready")
    profile.write_text(profile.read_text().replace(
        "compile = false", f'compile = true\ncompile_files = ["{broken}"]'))
    check = _cli("check", str(profile))
    assert check.returncode == 6, check.stdout + check.stderr
    assert f"{broken}:2" in check.stdout and "SyntaxError" in check.stdout
    result = _cli("wait", str(profile), "--launch")
    assert result.returncode == 6 and "Traceback" not in result.stderr
    assert f"{broken}:2" in result.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_hang_becomes_stalled_naming_the_frozen_gpus(tmp_path: Path, cleanup) -> None:
    profile = sim_profile(tmp_path, "hang", time_scale=300, stall="2s")
    result = _cli("wait", str(profile), "--launch", "--timeout", "60s")
    cleanup.append(_run_id(result.stdout))
    assert result.returncode == 5, result.stdout + result.stderr
    stalled = next(line for line in result.stdout.splitlines() if "STALLED" in line)
    assert "no log line for" in stalled
    assert "GPU memory and utilisation frozen on 0, 1, 2" in stalled
    assert "loading weights" in result.stdout


def test_oom_is_dead_with_the_out_of_memory_error(tmp_path: Path, cleanup) -> None:
    result, records = _wait_json(sim_profile(tmp_path, "oom", time_scale=300), cleanup)
    assert result.returncode == 3, result.stdout + result.stderr
    dead = next(r for r in records if r.get("state") == "dead")
    assert dead["process"] == "Worker_TP7" and dead["code"] == 1
    assert dead["root_cause"].startswith("torch.OutOfMemoryError: CUDA out of memory")


@pytest.mark.parametrize(("fixture", "outcome", "cause"), [
    ("vllm-crash-syntaxerror.log", "crashed", "SyntaxError"),
    ("vllm-startup-ready.log", "ready", None),
])
def test_explain_a_saved_log(fixture: str, outcome: str, cause: str | None) -> None:
    result = _cli("explain", str(ROOT / "tests" / "fixtures" / fixture), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"outcome", "last_phase", "root_cause", "runner_up", "failed_requests",
                           "symptoms", "hidden", "services"}
    assert report["outcome"] == outcome
    if cause is None:
        assert report["root_cause"] is None
    else:
        assert report["root_cause"]["line"].startswith(cause)
        assert "Engine core initialization failed" not in report["root_cause"]["line"]


def _give_up_after(profile: Path, ready_timeout: str, on_ready_timeout: str = "keep") -> Path:
    """The profile with [expect] ready_timeout (and on_ready_timeout) set."""
    profile.write_text(profile.read_text().replace(
        "[expect]\n", f'[expect]\nready_timeout = "{ready_timeout}"\n'
                      f'on_ready_timeout = "{on_ready_timeout}"\n', 1))
    return profile


def test_wait_gives_up_after_ready_timeout_and_the_server_keeps_running(
        tmp_path: Path, cleanup) -> None:
    profile = _give_up_after(sim_profile(tmp_path, "ready", time_scale=60), "3s")
    result = _cli("wait", str(profile), "--launch")  # a 25-minute load at x60: ~25 s
    run_id = _run_id(result.stdout)
    cleanup.append(run_id)
    assert result.returncode == 4, result.stdout + result.stderr
    given_up = next(line for line in result.stdout.splitlines() if "TIMEOUT" in line)
    assert given_up.split("] ", 1)[1] == (
        "TIMEOUT: not READY after 3.0s (ready_timeout), still loading; the run keeps running "
        '(on_ready_timeout = "keep")'), given_up
    assert carriers(run_id), "the server keeps running after wait gives up"
    status = _cli("status", str(profile))
    assert run_id in status.stdout and "alive" in status.stdout, status.stdout


def test_on_ready_timeout_kill_leaves_nothing_of_the_run(tmp_path: Path, cleanup) -> None:
    profile = _give_up_after(sim_profile(tmp_path, "ready", time_scale=60), "3s", "kill")
    result = _cli("wait", str(profile), "--launch", "--json")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    run_id = records[0]["run_id"]
    cleanup.append(run_id)
    assert result.returncode == 4, result.stdout + result.stderr
    said = [r["msg"] for r in records]
    assert ('TIMEOUT: not READY after 3.0s (ready_timeout), still loading; killing the run '
            '(on_ready_timeout = "kill")') in said, said
    assert "killed: no process of the run remains; GPU memory released" in said, said
    assert carriers(run_id) == []


@pytest.mark.parametrize(("ready_timeout", "timeout", "code", "said"), [
    ("2s", "60s", 0, "READY after"),  # a longer --timeout lets it reach READY
    ("10m", "2s", 4, "TIMEOUT: not READY after 2.0s (--timeout), still loading"),  # and shorter
])
def test_wait_timeout_overrides_ready_timeout(tmp_path: Path, cleanup, ready_timeout: str,
                                              timeout: str, code: int, said: str) -> None:
    scale = 300 if code == 0 else 60  # READY in ~5 s, or not for ~25 s
    profile = _give_up_after(sim_profile(tmp_path, "ready", time_scale=scale), ready_timeout)
    result = _cli("wait", str(profile), "--launch", "--timeout", timeout)
    run_id = _run_id(result.stdout)
    cleanup.append(run_id)
    assert result.returncode == code, result.stdout + result.stderr
    assert said in result.stdout, result.stdout
    assert carriers(run_id), "giving up (or READY) leaves the server running"


def test_wait_until_dead_watches_past_ready_to_the_death_while_serving(tmp_path: Path,
                                                                       cleanup) -> None:
    """`wait --until dead`: READY is a line, not the end; the engine core killed while serving
    is (exit 3), named with its cause, as a script or an alert needs it."""
    profile = sim_profile(tmp_path, "engine-killed", time_scale=300)
    result = _cli("wait", "--launch", "--until", "dead", str(profile), timeout=120)
    cleanup.append(_run_id(result.stdout))
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    ready = next(i for i, line in enumerate(lines) if "READY after" in line)
    dead = next(i for i, line in enumerate(lines) if "DEAD" in line)
    assert ready < dead and "EngineCore_DP0" in lines[dead] and "while serving" in lines[dead]
