"""specconsole's output is its own: no dependency's deprecation or import-time warning reaches
stderr, and `--json` keeps stdout pure JSON, whatever versions the venv resolved.

`python3 -m tui.bootstrap test --latest` runs this file again with the newest versions the
ranges in pyproject.toml allow: a new upstream release that starts warning fails here first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import sim_profile

from tui.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
CORPUS_LOG = ROOT / "tests" / "corpus" / "logs" / "vllm-10439.log"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_writes_nothing_on_stderr(command: str) -> None:
    result = _cli(*([command] if command else []), "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: specconsole")
    assert result.stderr == ""


# A profile that does not exist: the one line each command owes (exit 2).
PROFILE_COMMANDS = ("launch", "wait", "status", "kill", "logs", "stacks", "check", "history",
                    "console")


@pytest.mark.parametrize("command", PROFILE_COMMANDS)
def test_a_missing_profile_is_one_line_of_specconsole(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nosuch.toml"
    result = _cli(command, str(missing))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"specconsole: {missing}: cannot read profile: " \
                            "No such file or directory\n"


def test_a_missing_log_is_one_line_of_explain(tmp_path: Path) -> None:
    missing = tmp_path / "nosuch.log"
    result = _cli("explain", "--json", str(missing))
    assert result.stdout == ""
    assert result.stderr == f"specconsole: {missing}: No such file or directory\n"


def test_a_bad_demo_option_is_argparse_alone() -> None:
    result = _cli("demo", "--scenario", "nosuch")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith("usage: specconsole demo")
    assert lines[-1].startswith("specconsole demo: error: argument --scenario: invalid choice")
    assert "Warning" not in result.stderr


def test_explain_json_is_pure_json() -> None:
    result = _cli("explain", "--json", str(CORPUS_LOG))
    assert result.stderr == ""
    said = json.loads(result.stdout)
    expected = json.loads(CORPUS_LOG.with_suffix(".json").read_text())["root_cause"]
    assert said["root_cause"]["line"] and expected.endswith(said["root_cause"]["line"])


def test_wait_json_is_pure_json_and_stderr_is_ours(tmp_path: Path) -> None:
    """A real launch of the simulated engine to READY: every stdout line parses as JSON."""
    profile = sim_profile(tmp_path, "ready", time_scale=1000.0)
    try:
        result = _cli("wait", "--launch", "--json", "--timeout", "60", str(profile))
        assert result.returncode == 0, result.stderr
        events = [json.loads(line) for line in result.stdout.splitlines()]
        assert any("READY after" in e["msg"] for e in events), events
        assert result.stderr == ""
    finally:
        _cli("kill", "--grace", "2", str(profile))


# The filter itself, in a fresh interpreter (pytest keeps its own warning filters).
FILTER_PROBE = """
import warnings
from tui.cli.entry import quiet_dependency_warnings
quiet_dependency_warnings()
from cryptography.utils import CryptographyDeprecationWarning
for category, module in ((DeprecationWarning, "asyncssh.crypto.dsa"),
                         (FutureWarning, "textual.widgets"),
                         (CryptographyDeprecationWarning, "asyncssh.crypto.misc"),
                         (FutureWarning, "tui.core.profile"),
                         (UserWarning, "asyncssh.connection"),
                         (RuntimeWarning, "rich.console")):
    warnings.warn_explicit(f"probe {category.__name__} from {module}", category, "x.py", 1,
                           module=module)
"""


def _filtered(env: dict[str, str] | None = None) -> list[str]:
    done = subprocess.run([sys.executable, "-c", FILTER_PROBE], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return [line[line.index("probe "):] for line in done.stderr.splitlines() if "probe " in line]


def test_only_other_packages_deprecations_are_quiet() -> None:
    assert _filtered() == ["probe FutureWarning from tui.core.profile",
                           "probe UserWarning from asyncssh.connection",
                           "probe RuntimeWarning from rich.console"]


def test_the_filter_can_be_switched_off() -> None:
    # Python's own default hides DeprecationWarning outside __main__; the rest is shown
    assert _filtered({"SPECCONSOLE_DEPENDENCY_WARNINGS": "1"}) == [
        "probe FutureWarning from textual.widgets",
        "probe CryptographyDeprecationWarning from asyncssh.crypto.misc",
        "probe FutureWarning from tui.core.profile",
        "probe UserWarning from asyncssh.connection",
        "probe RuntimeWarning from rich.console"]
