"""Set up a virtual environment and run the demo, the test suite or the real-vLLM lane:
`python3 -m tui.bootstrap demo|test|vllm`.

Stdlib only, so it runs on a fresh machine with nothing but Python 3.10+. Debian's python3
lacks ensurepip unless python3-venv is installed; then the venv is made without pip and pip's
wheel is fetched from PyPI. Re-running is cheap: the install is skipped while pyproject.toml
is unchanged. The vLLM lane's own environment (3.5 GB) lives outside the repository, made and
reused by tests/vllm_lane/setup_env.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("SPECCONSOLE_VENV", ROOT / ".venv"))
PYPI_PIP = "https://pypi.org/pypi/pip/json"


def _python() -> Path:
    return VENV / "bin" / "python"


def _fetch_pip_wheel(into: Path) -> Path:
    with urllib.request.urlopen(PYPI_PIP, timeout=60) as resp:
        info = json.load(resp)
        base = resp.url
    url = urllib.parse.urljoin(base, next(u["url"] for u in info["urls"]
                                          if u["filename"].endswith(".whl")))
    wheel = into / url.rsplit("/", 1)[-1]
    with urllib.request.urlopen(url, timeout=120) as resp:
        wheel.write_bytes(resp.read())
    return wheel


def ensure_venv() -> None:
    if _python().exists():
        return
    print(f"bootstrap: creating {VENV}", flush=True)
    try:
        venv.EnvBuilder(with_pip=True).create(VENV)
    except (subprocess.CalledProcessError, OSError):
        print("bootstrap: no ensurepip here; fetching pip from PyPI", flush=True)
        venv.EnvBuilder(with_pip=False, clear=True).create(VENV)
        with tempfile.TemporaryDirectory() as tmp:
            wheel = _fetch_pip_wheel(Path(tmp))
            subprocess.run([str(_python()), f"{wheel}/pip", "install", "-q", str(wheel)],
                           check=True)


def ensure_installed(extra: str) -> None:
    target = f".[{extra}]" if extra else "."
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + target.encode()).hexdigest()
    stamp = VENV / f".specconsole-installed-{extra or 'base'}"
    if stamp.exists() and stamp.read_text() == digest:
        return
    print(f"bootstrap: installing specconsole{f'[{extra}]' if extra else ''} into {VENV}",
          flush=True)
    subprocess.run([str(_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-e", target], cwd=ROOT, check=True)
    stamp.write_text(digest)


def run_tests(extra_args: list[str]) -> int:
    """Lint (ruff), architecture contracts (import-linter), then the pytest suite."""
    bin_dir = VENV / "bin"
    for step in ([str(bin_dir / "ruff"), "check", "tui", "tests"],
                 [str(bin_dir / "lint-imports")]):
        print(f"bootstrap: {Path(step[0]).name} {' '.join(step[1:])}",
              flush=True)
        if subprocess.run(step, cwd=ROOT).returncode != 0:
            return 1
    return subprocess.run([str(_python()), "-m", "pytest", *extra_args], cwd=ROOT).returncode


def run_vllm_lane(extra_args: list[str]) -> int:
    """Make (or reuse) the vLLM environment, then run the tests marked `vllm` and print the
    figures they measured. A setup failure is its one line and exit 1: never a quiet skip."""
    started = time.monotonic()
    setup = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_lane" / "setup_env.py")],
                           cwd=ROOT)
    if setup.returncode != 0:
        return setup.returncode
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "figures.json"
        code = subprocess.run(
            [str(_python()), "-m", "pytest", "-m", "vllm", "tests/test_vllm_lane.py",
             *extra_args], cwd=ROOT,
            env={**os.environ, "SPECCONSOLE_VLLM_FIGURES": str(figures)}).returncode
        if figures.exists():
            for name, value in sorted(json.loads(figures.read_text()).items()):
                print(f"vllm lane: {name}: {value}", flush=True)
    print(f"vllm lane: {time.monotonic() - started:.0f} s in all", flush=True)
    return code


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "vllm"):
        print("usage: python3 -m tui.bootstrap demo [demo options] | test [pytest options]"
              " | vllm [pytest options]", file=sys.stderr)
        return 2
    ensure_venv()
    if argv[0] == "demo":
        ensure_installed("")
        return subprocess.run([str(VENV / "bin" / "specconsole"), "demo", *argv[1:]],
                              cwd=ROOT).returncode
    ensure_installed("test")
    if argv[0] == "vllm":
        return run_vllm_lane(argv[1:])
    return run_tests(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
