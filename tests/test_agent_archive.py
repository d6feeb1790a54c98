"""The agent ships as one archive that stands alone: built from tui/agent/, cached on the host by
its hash, sent again only when the host lacks it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

import psutil
import pytest

from tui.core.protocol import AGENT_BOOTSTRAP, Runs, agent_stdin
from tui.remote import agent_link
from tui.remote.agent_archive import PACKAGE, agent_archive
from tui.remote.agent_link import AgentTarget, call_agent
from tui.remote.session import LocalSession

ROOT = Path(__file__).resolve().parents[1]


def test_the_archive_is_the_agent_package_and_nothing_else() -> None:
    archive = agent_archive()
    names = zipfile.ZipFile(BytesIO(archive.data)).namelist()
    modules = sorted(p.name for p in (ROOT / "tui" / "agent").glob("*.py")
                     if p.name != "__main__.py")
    assert names == ["__main__.py", *(f"{PACKAGE}/{m}" for m in modules)]
    assert agent_archive.__wrapped__().digest == archive.digest  # deterministic: same bytes


@pytest.fixture(scope="module")
def psutil_only_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no pip, no tui, no textual, no pynvml) with psutil linked in."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig;print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "psutil").symlink_to(Path(psutil.__file__).parent)
    return python


def test_the_archive_runs_under_python_I_with_only_psutil(psutil_only_python: Path,
                                                        tmp_path: Path) -> None:
    for module in ("tui", "textual", "pynvml"):
        probe = subprocess.run([str(psutil_only_python), "-I", "-c", f"import {module}"],
                               capture_output=True, cwd=tmp_path)
        assert probe.returncode != 0, f"{module} importable: the test proves nothing"
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(agent_archive().data)
    runs = tmp_path / "runs" / "r1"
    runs.mkdir(parents=True)
    (runs / "launch.json").write_text(json.dumps({"run_id": "r1", "profile_key": "p@local",
                                                  "started": 1.0}))
    spec = json.dumps({"runs_dir": str(tmp_path / "runs")}).encode() + b"\n"
    done = subprocess.run([str(psutil_only_python), "-I", str(pyz), "runs"], input=spec,
                          capture_output=True, cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    msg = json.loads(done.stdout)
    assert msg["t"] == "runs" and [r["run_id"] for r in msg["runs"]] == ["r1"]
    # and through the bootstrap, as the console starts it: no NVML here, said as data
    preflight = subprocess.run(
        [str(psutil_only_python), "-I", "-u", "-c", AGENT_BOOTSTRAP, agent_archive().digest,
         "preflight"], input=agent_stdin(agent_archive().data, {"check_gpus": True}),
        capture_output=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=30)
    assert preflight.returncode == 0, preflight.stderr.decode()
    checks = json.loads(preflight.stdout)["checks"]
    assert checks[0]["check"] == "gpus_free" and "pynvml not importable" in checks[0]["message"]


async def test_the_host_keeps_the_archive_and_gets_it_again_when_it_lost_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    agent_link._CACHED.clear()
    sent: list[int] = []
    session = LocalSession()
    real_run = session.run

    async def counting_run(argv, stdin=b"", timeout=None):
        sent.append(int(stdin.split(b"\n", 1)[0]))
        return await real_run(argv, stdin, timeout)

    monkeypatch.setattr(session, "run", counting_run)
    target = AgentTarget(sys.executable)
    spec = {"runs_dir": str(tmp_path / "runs")}
    size = len(agent_archive().data)
    cached = tmp_path / ".specconsole" / "agent" / f"{agent_archive().digest}.pyz"
    assert isinstance((await call_agent(session, target, "runs", spec))[0], Runs)
    assert cached.read_bytes() == agent_archive().data
    assert isinstance((await call_agent(session, target, "runs", spec))[0], Runs)
    shutil.rmtree(cached.parent)  # the host lost it: agent_missing, then sent again
    assert isinstance((await call_agent(session, target, "runs", spec))[0], Runs)
    assert sent == [size, 0, 0, size]
    assert cached.exists()
