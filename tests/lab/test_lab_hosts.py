"""Bad hosts, through the real sshd: an unknown or changed host key, a client key the host
refuses, a remote Python without psutil or pynvml, a read-only run directory, a full disk.

Each is the real CLI (`launch`, `wait --launch`, `check`) as a user runs it. The answer must be
exactly one line on stderr, `specconsole: <host>: <what> — <fix>`, exit code 1 (the README's
`wait` table: error, naming the host and the fix), no traceback, and no run left behind: no
process carrying the profile's run ids, no run directory. Where the fix is a command, the test
runs it and the next try gets through: the line is not just worded, it is right.

The lab's sshd logs in as root, and root ignores mode bits, so "not writable" is a read-only
bind mount and "disk full" a filled 64 KiB tmpfs. Both are mounted in the host's own mount
namespace (sshd's, entered with nsenter; `ip netns exec` gave sshd a private one): the host sees
them, this process still sees the plain directory underneath, as with a real remote disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import carriers

from lab.netlab import Lab

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
EXIT_ERROR = 1  # the README's `wait` table: error (connection, agent), one line with the fix
EXIT_READY = 0


def _site_packages() -> Path | None:
    """The project environment's site-packages, wherever it is: $SPECCONSOLE_VENV (as
    tui/bootstrap.py reads it), else the environment running the tests (sys.prefix), else the
    checkout's .venv; the first that holds psutil."""
    configured = os.environ.get("SPECCONSOLE_VENV")
    for prefix in (Path(configured) if configured else None, Path(sys.prefix), ROOT / ".venv"):
        if prefix is None:
            continue
        for site in sorted((prefix / "lib").glob("python3*/site-packages")):
            if (site / "psutil").exists():
                return site
    return None


SITE = _site_packages()
ProfileFactory = Callable[..., Path]


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    """`specconsole ARGS` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def _run_processes(name: str) -> list[int]:
    """Live processes carrying a run id of profile `name` (whatever run a refusal began)."""
    needle = f"\0SPECCONSOLE_RUN_ID={name}-".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if needle in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
    return found


def _one_line(result: subprocess.CompletedProcess[str], lab: Lab, *needles: str) -> str:
    """The refusal: exit 1, nothing on stdout, one line on stderr naming the host; its text."""
    where = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == EXIT_ERROR, where
    assert result.stdout == "", where
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, where
    line = lines[0]
    assert line.startswith(f"specconsole: {lab.address('gpu-a')}: "), where
    assert " — " in line, f"no fix after the dash: {line}"
    for needle in needles:
        assert needle in line, f"{needle!r} not in: {line}"
    return line


def _nothing_left(name: str, runs: Path) -> None:
    """No process of the profile's runs, and no run directory, on this side of the mount."""
    assert _run_processes(name) == []
    assert not runs.exists() or list(runs.iterdir()) == []


def _host_sh(lab: Lab, script: str) -> subprocess.CompletedProcess[str]:
    """A shell command in gpu-a's mount namespace (sshd's), as the host sees its disks."""
    pid = lab.sshd_pids("gpu-a")[0]
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def host_mount(lab: Lab, target: Path, setup: str) -> Iterator[None]:
    """Run `setup` (mounts on `target`) in gpu-a's mount namespace; unmount on the way out."""
    target.mkdir(parents=True, exist_ok=True)
    done = _host_sh(lab, setup)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        _host_sh(lab, f"umount -l {target}")


def _record(figures: dict[str, Any], case: str, line: str) -> None:
    figures.setdefault("host faults: the one line", {})[case] = line


# -- keys and auth -------------------------------------------------------------------------

def test_unknown_host_key_refused_with_the_command_to_add_it(
        lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
        lab_figures: dict[str, Any]) -> None:
    """Strict checking is the default: a host not in known_hosts is refused, the file stays
    as it was, and the command the line gives adds the key so the next try gets through."""
    known = tmp_path / "known_hosts"
    known.write_text("".join(ln + "\n" for ln in lab.known_hosts.read_text().splitlines()
                             if not ln.startswith(lab.address("gpu-a") + ",")))
    before = known.read_text()
    assert lab.address("gpu-a") not in before
    profile = lab_profile(name="unknown-key", known_hosts=str(known))
    line = _one_line(_cli("launch", str(profile)), lab, "host key unknown", str(known),
                     "ssh-keyscan")
    _record(lab_figures, "unknown host key", line)
    assert known.read_text() == before  # nothing accepted behind the user's back
    _nothing_left("unknown-key", tmp_path / "runs")
    fix = line.split("add it with: ", 1)[1]
    assert subprocess.run(["sh", "-c", fix], timeout=30).returncode == 0
    checked = _cli("check", str(profile))
    assert checked.returncode == EXIT_READY, checked.stderr


def test_changed_host_key_refused_naming_the_change(
        lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
        lab_figures: dict[str, Any]) -> None:
    """known_hosts holds another key for the host: refused, "changed", and the two commands
    (remove the old entry, add the new one) that, once run, let `check` through."""
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"{lab.address('gpu-a')} "
                     + " ".join(Path(f"{other}.pub").read_text().split()[:2]) + "\n")
    before = known.read_text()
    profile = lab_profile(name="changed-key", known_hosts=str(known))
    line = _one_line(_cli("launch", str(profile)), lab, "host key changed", str(known),
                     "ssh-keygen -R")
    _record(lab_figures, "changed host key", line)
    assert known.read_text() == before
    _nothing_left("changed-key", tmp_path / "runs")
    found = re.search(r"remove the old one with: (.+?) and add the new one with: (.+)$", line)
    assert found, line
    for command in found.groups():
        assert subprocess.run(["sh", "-c", command], capture_output=True,
                              timeout=30).returncode == 0, command
    checked = _cli("check", str(profile))
    assert checked.returncode == EXIT_READY, checked.stderr


def test_client_key_not_authorized_names_user_and_config(
        lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
        lab_figures: dict[str, Any]) -> None:
    """A key the host does not list in authorized_keys: refused with the user, the host and
    the ssh config whose User/IdentityFile to fix."""
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                   check=True)
    config = tmp_path / "ssh_config"
    config.write_text(lab.ssh_config.read_text().replace(str(lab.client_key), str(stranger)))
    assert str(stranger) in config.read_text()
    line = _one_line(_cli("launch", str(lab_profile(name="bad-client-key")),
                          env={"SPECCONSOLE_SSH_CONFIG": str(config)}),
                     lab, "authentication refused for user root", str(config),
                     "IdentityFile")
    _record(lab_figures, "client key not authorized", line)
    _nothing_left("bad-client-key", tmp_path / "runs")


# -- the remote Python ---------------------------------------------------------------------

def _bare_python(where: Path, *modules: str) -> str:
    """A venv made without pip whose only third-party modules are `modules`, linked from the
    project's venv (a host whose Python lacks the others)."""
    subprocess.run(["python3", "-m", "venv",
                    "--without-pip", str(where)], check=True, timeout=60)
    if modules:
        assert SITE is not None, ("no site-packages with psutil under $SPECCONSOLE_VENV, "
                                  f"{sys.prefix} or {ROOT / '.venv'}")
        only = where / "only"
        only.mkdir()
        for module in modules:
            source = SITE / module if (SITE / module).exists() else SITE / f"{module}.py"
            assert source.exists(), source
            (only / source.name).symlink_to(source)
        site = next((where / "lib").glob("python3*/site-packages"))
        (site / "only.pth").write_text(f"{only}\n")
    python = where / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import psutil"], capture_output=True)
    assert (probe.returncode == 0) == ("psutil" in modules), probe.stderr
    return str(python)


def test_remote_python_without_psutil(lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
                                      lab_figures: dict[str, Any]) -> None:
    """host.python lacks psutil (the agent needs it): the launch is refused before anything
    starts, naming the interpreter, the module and host.python."""
    python = _bare_python(tmp_path / "bare")
    line = _one_line(_cli("launch", str(lab_profile(name="no-psutil", python=python))),
                     lab, python, "cannot import psutil", "host.python")
    _record(lab_figures, "remote python without psutil", line)
    _nothing_left("no-psutil", tmp_path / "runs")


def test_remote_python_without_pynvml(lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
                                      lab_figures: dict[str, Any]) -> None:
    """psutil but no pynvml: a real profile is refused by `check` in one line naming pynvml
    (and not psutil, which is there); a simulated one passes on the simulation's Python fake
    of pynvml (tui/sim/fakenvml; the C stand-in the other tests use needs the real
    nvidia-ml-py, as a GPU host's NVML does)."""
    python = _bare_python(tmp_path / "half", "psutil")
    simulated = lab_profile(name="no-pynvml-sim", python=python)
    real = tmp_path / "no-pynvml.toml"
    real.write_text(simulated.read_text().split("[simulate]")[0])
    fake = ROOT / "tui" / "sim" / "fakenvml"
    simulated.write_text(re.sub(r'(?m)^nvml = ".*"$', f'nvml = "{fake}"',
                                simulated.read_text()))
    line = _one_line(_cli("check", str(real)), lab, python, "cannot import pynvml",
                     "host.python")
    assert "psutil (" not in line and "psutil," not in line, line
    _record(lab_figures, "remote python without pynvml", line)
    checked = _cli("check", str(simulated))
    assert checked.returncode == EXIT_READY and not checked.stderr, checked.stderr
    _nothing_left("no-pynvml", tmp_path / "runs")


# -- the run directory and the disk --------------------------------------------------------

def test_run_dir_read_only(lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
                           lab_figures: dict[str, Any]) -> None:
    """host.runs_dir on a read-only mount (root ignores mode 0500; EROFS it cannot): one line,
    the path and "set host.runs_dir"; nothing started."""
    runs = tmp_path / "ro-runs"
    with host_mount(lab, runs, f"mount --bind {runs} {runs} && "
                               f"mount -o remount,ro,bind {runs}"):
        assert "Read-only" in _host_sh(lab, f"touch {runs}/probe").stderr
        line = _one_line(_cli("launch", str(lab_profile(name="ro-runs", runs_dir=str(runs)))),
                         lab, f"cannot create {runs}/ro-runs-", "Read-only file system",
                         "set host.runs_dir to a directory you can write")
    _record(lab_figures, "run dir read-only", line)
    _nothing_left("ro-runs", runs)


def _fill(lab: Lab, where: Path) -> None:
    """Fill the host's disk at `where` to the last block."""
    done = _host_sh(lab, f"dd if=/dev/zero of={where}/filler bs=4k 2>&1; df -k {where}")
    assert "No space left on device" in done.stdout, done.stdout
    assert done.stdout.split()[-3] == "0", done.stdout  # df: 0 blocks available


def test_disk_full_refuses_the_launch(lab: Lab, lab_profile: ProfileFactory, tmp_path: Path,
                                      lab_figures: dict[str, Any]) -> None:
    """runs_dir on a full disk: `launch` and `wait --launch` each refuse in one line (free
    space, or another runs_dir) and leave no half-made run directory on the host."""
    disk = tmp_path / "full"
    with host_mount(lab, disk, f"mount -t tmpfs -o size=64k specconsole-full {disk}"):
        _fill(lab, disk)
        profile = lab_profile(name="disk-full", runs_dir=str(disk / "runs"))
        lines = [_one_line(_cli(*args, str(profile), *more), lab, "No space left on device",
                           "free space on that disk, or set host.runs_dir")
                 for args, more in ((("launch",), ()),
                                    (("wait",), ("--launch", "--timeout", "30s")))]
        on_host = _host_sh(lab, f"ls -A {disk}/runs")
        assert on_host.returncode == 0 and on_host.stdout == "", on_host
    _record(lab_figures, "disk full", lines[0])
    _nothing_left("disk-full", disk / "runs")


async def test_disk_fills_during_the_run(lab: Lab, lab_profile: ProfileFactory,
                                         tmp_path: Path, cleanup: list[str],
                                         lab_figures: dict[str, Any]) -> None:
    """The disk fills mid-load, so the server's log cannot grow: `wait` says so (the disk is
    low from the start, then full), supervision goes on (no traceback, READY from the health
    endpoint), and `kill` still ends the run without a process left."""
    disk = tmp_path / "filling"
    with host_mount(lab, disk, f"mount -t tmpfs -o size=512k specconsole-filling {disk}"):
        profile = lab_profile(name="disk-fills", runs_dir=str(disk / "runs"), time_scale=100)
        started = time.monotonic()
        waiting = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui", "wait", str(profile), "--launch", "--timeout", "90s",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"})
        assert waiting.stdout is not None
        first = (await asyncio.wait_for(waiting.stdout.readline(), 30)).decode()
        found = re.search(r"launched run (\S+) ", first)
        assert found, first
        run_id = found[1]
        cleanup.append(run_id)
        await asyncio.sleep(2.0)  # mid-load
        await asyncio.to_thread(_fill, lab, disk)
        filled = time.monotonic() - started
        rest, err = await asyncio.wait_for(waiting.communicate(), 120)
        out = first + rest.decode()
        assert waiting.returncode == EXIT_READY, out + err.decode()
        assert "READY after" in out and "Traceback" not in out + err.decode(), out
        # said, not silent: low from the start (a 512 KiB disk), then full once filled
        low = out.index("disk almost full where the run's log is written")
        full = out.index("disk full where the run's log is written")
        assert low < full and "the server's output is being lost" in out[full:], out
        log = _host_sh(lab, f"stat -c %s {disk}/runs/{run_id}/server.log")
        assert log.returncode == 0, log.stderr
        assert carriers(run_id), "the server should still be up"
        killed = await asyncio.to_thread(_cli, "kill", str(profile), "--grace", "3")
        assert killed.returncode == 0 and "Traceback" not in killed.stderr, killed
        deadline = time.monotonic() + 10
        while carriers(run_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert carriers(run_id) == []
    lab_figures["disk fills during the run"] = {
        "filled_at_s": round(filled, 1), "log_bytes_when_full": int(log.stdout),
        "wait_exit": waiting.returncode, "kill_exit": killed.returncode}
