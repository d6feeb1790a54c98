"""Bad input: every mistake a user, a profile, a host or a log can hold ends as one line of
error or as safe text on screen; never a traceback, never a lost or orphaned run.

- profiles, through the real CLI of every command: exit 2, one line `file:line: key: why`;
- shell metacharacters in every profile string that reaches a command, on a real launch (here
  and through the in-process SSH server): the server process receives the exact strings (its
  argv, environ and cwd as it reads them, and /proc) and nothing the strings say is run;
- hostile log text (OSC titles and clipboard, cursor moves and screen clears, DCS, C1 controls,
  invalid UTF-8, NUL, a 10 MB line) on what the console really draws, and in `logs`/`wait`;
- secrets on the console's screen, in `status`, the launch record, history and `wait`.

Host faults through a real OpenSSH sshd (keys, auth, remote Python, run dir read-only, disk
full) are in tests/lab/test_lab_hosts.py; a 1 GB log in tests/lab/test_lab_biglog.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import carriers, free_port, sim_profile, until
from sshserver import SSHTestServer

from tui.cli import main as cli
from tui.console.app import ConsoleApp
from tui.console.widgets.banner import Banner
from tui.console.widgets.logs import LogView
from tui.core.profile import HostConfig, load_profile
from tui.core.state import State
from tui.remote.interface import Session
from tui.remote.session import open_session
from tui.supervise.history import History
from tui.supervise.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# What may reach a terminal from a CLI: printable text, newlines and tabs. No ESC, no other C0
# control, no DEL, no C1 control (an 8-bit CSI or OSC).
UNSAFE_OUTPUT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What Textual itself writes around the text it draws: SGR colours and cursor positioning.
TEXTUAL_OWN = re.compile(r"\x1b\[[0-9;:]*m|\x1b\[\d+;\d+H")
UNSAFE_SCREEN = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # the screen gets no tab either


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "tui", *args], cwd=ROOT, text=True, capture_output=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


async def _acli(*args: str, env: dict[str, str] | None = None, timeout: float = 60
                ) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess while this event loop keeps serving the in-process SSH server."""
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "tui", *args, cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return subprocess.CompletedProcess(list(args), proc.returncode or 0,
                                       out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))


def _run_id(stdout: str) -> str:
    for line in stdout.splitlines():
        if " run " in line:
            return line.split(" run ", 1)[1].split()[0]
    raise AssertionError(f"no run id in {stdout!r}")


def _toml(value: object) -> str:
    """A TOML value: JSON's string and array syntax is TOML's for these."""
    return json.dumps(value)


def command_profile(tmp: Path, name: str, command: list[str], *, host: str = "local",
                    extra: str = "", env: dict[str, str] | None = None,
                    secret_env: tuple[str, ...] = ()) -> Path:
    """A profile whose server is `command` (no simulated engine), its runs under tmp/runs."""
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[host]
target = "{host}"
python = {_toml(PY)}
runs_dir = {_toml(str(tmp / 'runs'))}

[server]
engine = "vllm"
port = {free_port()}
command = {_toml(command)}
env = {{ {', '.join(f'{k} = {_toml(v)}' for k, v in (env or {}).items())} }}
secret_env = {_toml(list(secret_env))}

[preflight]
enabled = false
{extra}
""")
    return path


def rendered(app: ConsoleApp) -> str:
    """Exactly what the console would write to the terminal for a full redraw now."""
    return app.screen._compositor.render_full_update().render_segments(app.console)


def screen_text(app: ConsoleApp) -> str:
    """The text on screen, row by row; asserts no byte of it could drive the terminal."""
    data = rendered(app)
    text = TEXTUAL_OWN.sub("", data)
    bad = sorted({repr(c) for c in UNSAFE_SCREEN.findall(text)} | (
        {"ESC"} if "\x1b" in text else set()))
    assert not bad, f"the console would write {bad} to the terminal"
    return text



def _opener(server: SSHTestServer | None) -> Callable[[HostConfig], object]:
    async def opener(host: HostConfig) -> Session:
        return await open_session(host, ssh_config=server.ssh_config if server else None)
    return opener


# =============================================================================== profiles

HEAD = '[host]\ntarget = "local"\nruns_dir = "{runs}"\n\n[server]\nengine = "vllm"\n'  # 6 lines
SPEC = '\n[server.speculative]\n'  # the table's header is on the body's line 2 (+1 blank)

# (id, server body from line 7, line, key or "" (syntax), the message after "line: key: ")
BAD_PROFILES = [
    ("toml-syntax", 'model = "/models/m"\nport = 80 00\n', 8, "",
     "TOML syntax error: Expected newline or end of document after a statement"),
    ("unknown-key", 'model = "/models/m"\ntensor_paralel_size = 8\n', 8,
     "server.tensor_paralel_size",
     "unknown key 'tensor_paralel_size' (did you mean 'tensor_parallel_size'?)"),
    ("wrong-type", 'model = "/models/m"\nport = "8000"\n', 8, "server.port",
     "expected an integer, got a string ('8000')"),
    ("missing-model", "port = 8000\n", 5, "server.model",
     "missing required key 'model' (needed unless `command` is given)"),
    ("port-out-of-range", 'model = "/models/m"\nport = 70000\n', 8, "server.port",
     "must be between 1 and 65535, got 70000"),
    ("negative-tp", 'model = "/models/m"\ntensor_parallel_size = -2\n', 8,
     "server.tensor_parallel_size", "must be >= 1, got -2"),
    ("unknown-speculative-method",
     'model = "/models/m"\n' + SPEC + 'method = "eagle-3"\nmodel = "/models/d"\n', 10,
     "server.speculative.method",
     "unknown value 'eagle-3' (did you mean 'eagle3'?); expected one of: eagle3, eagle, ngram, "
     "medusa, mtp, draft_model, suffix"),
    ("eagle3-without-drafter",
     'model = "/models/m"\n' + SPEC + 'method = "eagle3"\nnum_speculative_tokens = 5\n', 9,
     "server.speculative.model",
     "method 'eagle3' needs the drafter's `model` (a path or Hugging Face id)"),
]
# every command that reads a profile; the console is `specconsole PROFILE`
COMMANDS_READING_A_PROFILE = [
    ["wait", "{p}", "--launch"], ["launch", "{p}"], ["check", "{p}"], ["kill", "{p}"],
    ["logs", "{p}"], ["status", "{p}"], ["history", "{p}"], ["{p}"], ["console", "{p}"],
]


@pytest.mark.parametrize(("body", "line", "key", "why"), [c[1:] for c in BAD_PROFILES],
                         ids=[c[0] for c in BAD_PROFILES])
def test_a_bad_profile_is_one_line_naming_file_line_and_key_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, line: int, key: str,
        why: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(HEAD.format(runs=tmp_path / "runs") + body)
    for argv in COMMANDS_READING_A_PROFILE:
        code = cli.main([a.format(p=path) for a in argv])
        out, err = capsys.readouterr()
        assert code == 2, (argv, out, err)
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (argv, out, err)
        where = f"specconsole: {path}:{line}"
        if key:
            assert err == f"{where}: {key}: {why}\n", argv
        else:  # a syntax error has a column and no key
            assert re.fullmatch(rf"{re.escape(where)}:\d+: {re.escape(why)}\n", err), (argv, err)
    assert not (tmp_path / "runs").exists(), "nothing was launched or created"


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read profile: No such file or directory"),
    (b'[host]\ntarget = "\xff"\n', "not UTF-8 text (byte 17)"),
], ids=["missing-file", "not-utf8"])
def test_an_unreadable_profile_is_one_line_exit_2(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  content: bytes | None, why: str) -> None:
    path = tmp_path / "p.toml"
    if content is not None:
        path.write_bytes(content)
    for argv in (["wait", str(path), "--launch"], ["check", str(path)], [str(path)]):
        assert cli.main(argv) == 2
        out, err = capsys.readouterr()
        assert (out, err) == ("", f"specconsole: {path}: {why}\n")


def test_a_secret_missing_from_the_environment_refuses_the_launch_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = command_profile(tmp_path, "needs-secret", ["sleep", "30"],
                           secret_env=("SPECCONSOLE_TEST_NOT_SET",))
    os.environ.pop("SPECCONSOLE_TEST_NOT_SET", None)
    assert cli.main(["wait", str(path), "--launch"]) == 2
    assert capsys.readouterr().err == (
        f"specconsole: {path}: server.secret_env: secret SPECCONSOLE_TEST_NOT_SET is not set in "
        "the local environment; export SPECCONSOLE_TEST_NOT_SET=... before launching "
        "needs-secret\n")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_more_tensor_parallel_than_visible_gpus_is_a_preflight_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cleanup: list[str]) -> None:
    path = sim_profile(tmp_path, "ready", time_scale=300)
    path.write_text(path.read_text().replace("gpus = 8", "gpus = 2"))  # TP stays 8
    assert cli.main(["check", str(path)]) == 0  # a warning, not a refusal
    out, err = capsys.readouterr()
    assert "warn gpu_count: 8 GPUs expected, 2 visible\n" in out and err == ""
    assert "FAIL" not in out
    code = cli.main(["wait", str(path), "--launch", "--timeout", "2s"])
    out, _ = capsys.readouterr()
    cleanup.append(_run_id(out))
    assert code == 4  # launched anyway (a 25-minute load at x300 is not ready in 2 s)
    assert "] preflight warning — gpu_count: 8 GPUs expected, 2 visible\n" in out
    assert cli.main(["kill", str(path), "--grace", "2"]) == 0
    capsys.readouterr()


# ============================================================== shell metacharacters, for real

RECORDER = """\
import json, os, sys, time
record = {"argv": sys.argv[1:], "environ": dict(os.environ), "cwd": os.getcwd()}
path = os.environ["RECORD_TO"]
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
print("recorder started with", len(sys.argv) - 1, "arguments", flush=True)
time.sleep(120)
"""


@pytest.fixture
def marks() -> Iterator[tuple[Path, Path]]:
    """(marker, victim): a file no payload may create and a directory none may delete, under a
    short path so that payloads naming them still fit in a file name."""
    short = Path(tempfile.mkdtemp(prefix="sc-"))
    (short / "victim").mkdir()
    (short / "victim" / "keep").write_text("x")
    yield short / "pwned", short / "victim"
    shutil.rmtree(short)


def shell_payloads(marker: Path, victim: Path) -> list[str]:
    """Strings that run `touch marker` or delete `victim` if a shell ever interprets them.
    The paths are spelled with printf's octal escapes (no "/"), so they fit in file names."""
    m, v = ("$(printf '{}')".format(str(p).replace("/", "\\057")) for p in (marker, victim))
    return [f"$(touch {m})", f"`touch {m}`", f"; touch {m}", f"; rm -rf {v}",
            f"&& rm -rf {v} #", f"| touch {m}", f"> {m}", f"' ; touch {m} ; '",
            f'" ; touch {m} ; "', f"\ntouch {m}\n", "$HOME ${PATH} * ~ !! \\", ""]


@pytest.mark.parametrize("over", ["local", "ssh"])
async def test_shell_metacharacters_reach_the_server_literally(
        tmp_path: Path, ssh_server: SSHTestServer, cleanup: list[str], over: str,
        marks: tuple[Path, Path]) -> None:
    marker, victim = marks
    payloads = shell_payloads(marker, victim)
    one = " ".join(payloads[i] for i in (0, 1, 3, 7))  # fits in a file name: no "/"
    # the host's Python and the server's executable live in a directory named by the payloads
    evil_dir = tmp_path / f"bin {one}"
    evil_dir.mkdir()
    python = evil_dir / "python"
    python.write_text(f"#!/bin/sh\nexec {PY} \"$@\"\n")
    python.chmod(0o755)
    recorder = evil_dir / "recorder.py"
    recorder.write_text(RECORDER)
    workdir = tmp_path / f"cwd {one}"
    workdir.mkdir()
    record = tmp_path / "record.json"
    secret = f"s3cr3t-{one}"
    env = {f"EVIL_{i}": p for i, p in enumerate(payloads)} | {"RECORD_TO": str(record)}
    port = free_port()
    path = tmp_path / "evil.toml"
    path.write_text(f"""
[host]
target = "{ssh_server.alias if over == 'ssh' else 'local'}"
python = {_toml(str(python))}
runs_dir = {_toml(str(tmp_path / f'runs {one}'))}
workdir = {_toml(str(workdir))}

[server]
engine = "vllm"
executable = {_toml([str(python), str(recorder)])}
model = {_toml(one)}
listen = {_toml(payloads[0])}
port = {port}
args = {_toml(payloads)}
env = {{ {', '.join(f'{k} = {_toml(v)}' for k, v in env.items())} }}
secret_env = ["SPECCONSOLE_EVIL_SECRET"]

[server.speculative]
method = "eagle3"
model = {_toml(payloads[1])}
note = {_toml(payloads[2])}

[preflight]
enabled = false
""")
    cli_env = {"SPECCONSOLE_EVIL_SECRET": secret, **(ssh_server.env if over == "ssh" else {})}
    launched = await _acli("launch", str(path), env=cli_env)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_id = _run_id(launched.stdout)
    cleanup.append(run_id)
    pid = int(launched.stdout.split("(pid ", 1)[1].split(")")[0])
    deadline = time.monotonic() + 20
    while not record.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    got = json.loads(record.read_text())
    spec = json.dumps({"method": "eagle3", "model": payloads[1], "note": payloads[2]})
    expected = [one, "--port", str(port), "--host", payloads[0], "--tensor-parallel-size", "1",
                "--speculative-config", spec, *payloads]
    assert got["argv"] == expected
    # server.env is path-like: `${NAME}` (braced only) is expanded from the console's
    # environment when the profile is read (README); nothing else is, and no shell is involved
    env["EVIL_10"] = f"$HOME {os.environ['PATH']} * ~ !! \\"
    assert {k: got["environ"].get(k) for k in env} == env
    assert got["environ"]["SPECCONSOLE_EVIL_SECRET"] == secret  # the real value, not redacted
    assert got["cwd"] == str(workdir)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in cmdline[1:]] == [str(recorder), *expected]
    environ = dict(e.decode().split("=", 1)
                   for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e)
    assert environ["SPECCONSOLE_EVIL_SECRET"] == secret and environ["EVIL_0"] == payloads[0]
    # every other command on the evil paths: status, logs (stat/dd on the run dir), kill
    status = await _acli("status", str(path), env=cli_env)
    assert status.returncode == 0 and f"{run_id} alive" in status.stdout, status.stderr
    logs = await _acli("logs", str(path), "--raw", env=cli_env)
    assert logs.returncode == 0, logs.stderr
    assert f"recorder started with {len(expected)} arguments" in logs.stdout
    killed = await _acli("kill", str(path), "--grace", "2", env=cli_env)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert carriers(run_id) == []
    assert not marker.exists(), "a payload was run by a shell"
    assert (victim / "keep").exists(), "a payload was run by a shell"
    if over == "ssh":
        assert len(ssh_server.commands) >= 6  # every call above went through the SSH server


def test_the_payloads_do_run_when_unquoted(tmp_path: Path, marks: tuple[Path, Path]) -> None:
    """The test above can fail: the same strings, given to a shell unquoted, do run."""
    marker, victim = marks
    for payload in shell_payloads(marker, victim)[:4]:
        subprocess.run(["sh", "-c", f"true {payload}"], cwd=tmp_path, capture_output=True,
                       timeout=10)
    assert marker.exists() and not victim.exists()


# ======================================================================== hostile log text

HOSTILE = r'''
import os, subprocess, sys, time
out = sys.stdout.buffer
# a process of the run whose vLLM-style title (argv[0]) carries escapes: the process pane, the
# DEAD line and the banner name it
named = subprocess.Popen(["VLLM::\x1b]0;PWNED-NAME\x07\x1b[2JEvilCore", "60"],
                         executable="/bin/sleep")
out.write(b"\n".join([
    b"osc0 \x1b]0;PWNED-TITLE\x07 end-osc0",
    b"osc2 \x1b]2;PWNED-TITLE2\x1b\\ end-osc2",
    b"osc52 \x1b]52;c;cm0gLXJmIH4K\x07 end-osc52",
    b"clear \x1b[H\x1b[2J\x1b[3J end-clear",
    b"dcs \x1bP1$qm\x1b\\ \x1bPq#0;2;0;0;0\x1b\\ end-dcs",
    b"cursor \x1b[10;10H\x1b[?25l\x1b[6n\x1b[c\x1b7\x1b8 end-cursor",
    b"c1 \xc2\x9b31m \xc2\x9d0;PWNED-C1\xc2\x9c end-c1",
    b"badutf8 \xff\xfe\xc3( end-badutf8",
    b"nul \x00\x00 end-nul",
    b"ctl \x07 \x08 \x7f \x0b \x0c end-ctl",
    b"\x1b[31mred\x1b[0m end-colour",
]) + b"\n")
out.flush()
out.write(b"LONG" + b"L" * (10 * 1024 * 1024) + b"\x1b]0;PWNED-LONG\x07 end-long\n")
out.write(b"AFTER-LONG-LINE\n")
out.flush()
time.sleep(float(os.environ.get("HOSTILE_SLEEP", "0")))
go = os.environ.get("HOSTILE_GO")  # the test says when it has looked
for _ in range(1200 if go else 0):
    if os.path.exists(go):
        break
    time.sleep(0.05)
out.write(b"Traceback (most recent call last):\n  File \"/srv/x.py\", line 1, in <module>\n"
          b"ValueError: boom \x1b]0;PWNED-CAUSE\x07\x1b[2J end-cause\n")
out.flush()
time.sleep(0.3)
named.kill()  # left unreaped a moment, so the agent reads its signal: the run's first death
time.sleep(0.3)
sys.exit(1)
'''
VISIBLE = ["end-osc0", "end-osc2", "end-osc52", "end-clear", "end-dcs", "end-cursor", "end-c1",
           "badutf8 \ufffd\ufffd\ufffd( end-badutf8", "nul  end-nul", "end-ctl", "red end-colour",
           "AFTER-LONG-LINE"]
HOSTILE_ARG = "\x1b]0;PWNED-ARGV\x07\x1b[2Jargv-end"  # in the run's command line


def hostile_profile(tmp: Path, host: str = "local", sleep: float = 0,
                    go: Path | None = None) -> Path:
    """`go`: the server dies only once this file exists (the test has looked at it alive)."""
    script = tmp / "hostile.py"
    script.write_text(HOSTILE)
    env = {"HOSTILE_SLEEP": str(sleep), **({"HOSTILE_GO": str(go)} if go else {})}
    return command_profile(tmp, "hostile", [PY, str(script), HOSTILE_ARG], host=host, env=env)


@pytest.mark.parametrize("over", ["local", "ssh"])
async def test_hostile_log_text_never_reaches_the_terminal_from_the_console(
        tmp_path: Path, ssh_server: SSHTestServer, cleanup: list[str], over: str) -> None:
    server = ssh_server if over == "ssh" else None
    go = tmp_path / "go"
    profile = load_profile(hostile_profile(tmp_path, ssh_server.alias if server else "local",
                                           go=go))
    sup = Supervisor(profile, opener=_opener(server))
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(200, 80)) as pilot:
        started = time.monotonic()
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)
        await until(pilot, lambda: any("AFTER-LONG-LINE" in e.line.plain
                                       for e in app.window.view(raw=True)),
                    20, "the line after the 10 MB line")
        took = time.monotonic() - started
        await pilot.pause(0.3)
        assert sup.machine.state is not State.DEAD, "HOSTILE_GO keeps it alive"
        text = screen_text(app)
        for visible in VISIBLE:
            assert visible in text, f"{visible!r} is not on screen"
        assert "EvilCore" in text  # the process pane drew its name, cleaned
        assert "LONGLLLL" in text
        await pilot.press("f")  # the raw view draws the same lines
        assert all(v in screen_text(app) for v in VISIBLE)
        await pilot.press("f")
        go.touch()
        await until(pilot, lambda: "end-cause" in str(app.query_one(Banner).render()), 20,
                    "the DEAD banner with its cause")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "ValueError: boom  end-cause" in text
        assert "PWNED" not in text and "cm0gLXJmIH4K" not in text
        held = sum(len(e.line.raw) for e in app.window.view(raw=True))
        assert held < 12 * 2**20, "the console holds the long line once"
        assert app.query_one(LogView).window is app.window
    assert took < 15, f"the 10 MB line held the console up for {took:.1f}s"


def test_hostile_log_text_in_wait_logs_and_history_is_plain(tmp_path: Path,
                                                            cleanup: list[str]) -> None:
    # the named process lives a second before its kill: the agent has read its name (a
    # process killed before the agent's first look is known by its comm only, `sleep`)
    path = hostile_profile(tmp_path, sleep=1)
    waited = _cli("wait", str(path), "--launch", "--timeout", "60s")
    cleanup.append(_run_id(waited.stdout))
    assert waited.returncode == 3, waited.stdout + waited.stderr
    assert not UNSAFE_OUTPUT.search(waited.stdout + waited.stderr)
    cause = next(line for line in waited.stdout.splitlines() if "root cause" in line)
    assert "ValueError: boom  end-cause" in cause, cause
    assert "DEAD: EvilCore (pid" in waited.stdout and "signal 9" in waited.stdout, waited.stdout
    as_json = _cli("wait", str(path), "--json", "--timeout", "20s")  # attaches to the dead run
    assert as_json.returncode == 3
    for line in as_json.stdout.splitlines():
        record = json.loads(line)
        assert not UNSAFE_OUTPUT.search(json.dumps(record, ensure_ascii=False)), record
    started = time.monotonic()
    logs = _cli("logs", str(path), "--raw")
    took = time.monotonic() - started
    assert logs.returncode == 0, logs.stderr
    assert not UNSAFE_OUTPUT.search(logs.stdout + logs.stderr)
    for visible in [*VISIBLE, "ValueError: boom  end-cause"]:
        assert visible in logs.stdout
    assert "PWNED" not in logs.stdout
    long = [line for line in logs.stdout.splitlines() if line.startswith("L")]
    assert sum(map(len, long)) >= 10 * 2**20, "the 10 MB line is all there"
    assert took < 30
    history = _cli("history", str(path))
    assert history.returncode == 0 and "ValueError: boom" in history.stdout, history.stdout
    assert not UNSAFE_OUTPUT.search(history.stdout)


# ================================================================================= secrets

TOKEN = "hf_TOPSECRET_0123456789abcdef"
LEAKY = """\
echo "token=$HF_TOKEN"
python3 -c 'import os, subprocess as s; s.run(["VLLM::Worker_" + os.environ["HF_TOKEN"], "4"],
                                               executable="/bin/sleep")'
exec python3 -c 'import os; raise ValueError("bad token " + os.environ["HF_TOKEN"])'
"""  # a log line, a process named (vLLM's title) after the secret, a root cause holding it


async def test_a_secret_never_reaches_the_screen_status_launch_record_or_history(
        tmp_path: Path, cleanup: list[str]) -> None:
    path = command_profile(tmp_path, "leaky", ["sh", "-c", LEAKY], secret_env=("HF_TOKEN",))
    history = History(tmp_path / "history.sqlite3")
    sup = Supervisor(load_profile(path), environ={**os.environ, "HF_TOKEN": TOKEN},
                     history=history)
    app = ConsoleApp(sup, kill_grace=1.0)
    screens: list[str] = []
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)

        def seen(text: str) -> bool:
            screens.append(screen_text(app))
            return text in screens[-1]
        await until(pilot, lambda: seen("Worker_«redac"), 10,
                    "the process named after the secret, redacted, in the process pane")
        # the log line, written before that process started, drawn by its own pane (on a busy
        # machine a frame after the process pane's)
        await until(pilot, lambda: seen("token=«redacted»"), 5, "the log line, redacted")
        await pilot.press("f")
        assert seen("token=«redacted»")
        await until(pilot, lambda: sup.machine.state is State.DEAD, 20, "DEAD")
        await until(pilot, lambda: seen("ValueError: bad token «redacted»"), 5,
                    "the root cause on the banner")
    assert not [s for s in screens if "hf_TOP" in s]  # not even cut short by a column
    run_dir = Path(sup.run.run_dir)
    assert TOKEN.encode() in (run_dir / "server.log").read_bytes()  # the file is the truth...
    assert (run_dir.stat().st_mode & 0o777) == 0o700  # ...kept in a directory only we read
    assert (run_dir.parent.stat().st_mode & 0o777) == 0o700
    for name in ("server.log", "launch.json", "pid", "exit.json"):
        assert ((run_dir / name).stat().st_mode & 0o777) == 0o600, name
    launch = json.loads((run_dir / "launch.json").read_text())
    assert "HF_TOKEN" in launch["env_names"] and "TOPSECRET" not in json.dumps(launch)
    with sqlite3.connect(history.path) as db:
        assert "TOPSECRET" not in json.dumps(db.execute("select * from launches").fetchall())
    assert b"TOPSECRET" not in (tmp_path / "history.sqlite3").read_bytes()
    # the CLI, from a shell with the secret and from one without it
    for env in ({"HF_TOKEN": TOKEN}, {"HF_TOKEN": ""}):
        for argv in (["status", str(path)], ["wait", str(path), "--timeout", "10s"],
                     ["logs", str(path), "--raw"]):
            result = _cli(*argv, env=env)
            assert result.returncode in (0, 3), result.stdout + result.stderr
            assert "TOPSECRET" not in result.stdout + result.stderr, (argv, env)
