"""The README's commands on a Python without ensurepip (Debian without python3-venv)."""

from __future__ import annotations

import subprocess
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
    monkeypatch.setattr(bootstrap, "VENV", tmp_path / "venv")
    bootstrap.ensure_venv()
    pip = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "--version"],
                         capture_output=True, text=True)
    assert pip.returncode == 0 and str(tmp_path / "venv") in pip.stdout


def test_usage_without_a_command_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bootstrap.main([]) == 2
    assert "usage: python3 -m tui.bootstrap demo" in capsys.readouterr().err
