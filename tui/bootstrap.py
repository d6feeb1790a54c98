"""Set up a virtual environment and run the demo, the test suite, the real-log corpus score,
the fault lab, the real-vLLM lane, the container lane or the Slurm lane:
`python3 -m tui.bootstrap demo|test|score|lab|vllm|containers|slurm`.

Stdlib only, so it runs on a fresh machine with nothing but Python 3.10+. The project's venv is
synced by uv from uv.lock, the lock of the whole dependency tree, so that what passed CI today
installs the same tomorrow; `test --latest` runs the suite once more in a throw-away venv with
the newest versions pyproject.toml's ranges allow, to find upstream drift before users do. uv
itself (a pinned version) lives in a small venv of its own under ~/.cache/specconsole/tools.
Debian's python3 lacks ensurepip unless python3-venv is installed; then that venv is made
without pip and pip's wheel is fetched from PyPI. The vLLM lane's own environment (3.5 GB)
lives outside the repository, made and reused by tests/vllm_lane/setup_env.py; the fault lab's
Ray environment likewise, by ensure_lab_env (in $SPECCONSOLE_LAB_ENV or
~/.cache/specconsole/lab-ray).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("SPECCONSOLE_VENV", ROOT / ".venv"))
PYPI_PIP = "https://pypi.org/pypi/pip/json"
UV_VERSION = "0.13.9"
TOOLS = Path(os.environ.get("SPECCONSOLE_TOOLS",
                            Path.home() / ".cache" / "specconsole" / "tools"))
LOCK = ROOT / "uv.lock"


def _python(venv_dir: Path | None = None) -> Path:
    return (venv_dir or VENV) / "bin" / "python"


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


def make_venv(venv_dir: Path) -> None:
    """A venv with pip at `venv_dir` (kept when it is there already)."""
    if _python(venv_dir).exists():
        return
    print(f"bootstrap: creating {venv_dir}", flush=True)
    try:
        venv.EnvBuilder(with_pip=True).create(venv_dir)
    except (subprocess.CalledProcessError, OSError):
        print("bootstrap: no ensurepip here; fetching pip from PyPI", flush=True)
        venv.EnvBuilder(with_pip=False, clear=True).create(venv_dir)
        with tempfile.TemporaryDirectory() as tmp:
            wheel = _fetch_pip_wheel(Path(tmp))
            subprocess.run([str(_python(venv_dir)), f"{wheel}/pip", "install", "-q", str(wheel)],
                           check=True)


def ensure_uv() -> Path:
    """The pinned uv, in a venv of its own (made once, shared by every checkout)."""
    home = TOOLS / f"uv-{UV_VERSION}"
    uv = home / "bin" / "uv"
    if not uv.exists():
        make_venv(home)
        print(f"bootstrap: installing uv {UV_VERSION} into {home}", flush=True)
        why = _step([str(_python(home)), "-m", "pip", "install", "-q",
                     "--disable-pip-version-check", f"uv=={UV_VERSION}"],
                    f"pip install uv=={UV_VERSION}")
        if why is not None:
            raise SystemExit(f"bootstrap: {why}")
    return uv


def _uv_env(venv_dir: Path) -> dict[str, str]:
    """uv acting on `venv_dir` with this interpreter; never a Python of its own download."""
    return {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv_dir),
            "UV_PYTHON": sys.executable, "UV_PYTHON_DOWNLOADS": "never",
            "VIRTUAL_ENV": str(venv_dir)}


def ensure_installed(*extras: str) -> None:
    """The venv as uv.lock says (with the extras). With extras it syncs exactly; the demo
    (none) only adds, so that a demo run after the tests leaves their tools in place."""
    uv = ensure_uv()
    argv = [str(uv), "sync", "--frozen", "--quiet"]
    argv += [w for extra in extras for w in ("--extra", extra)] if extras else ["--inexact"]
    subprocess.run(argv, cwd=ROOT, env=_uv_env(VENV), check=True)


def _workers(extra_args: list[str]) -> list[str]:
    """pytest-xdist's options: a worker per core (most of the suite's time is spent waiting
    on the processes it starts: real servers, agents, SSH sessions; a worker more than the
    cores made timing-bound tests flaky on a busy 2-core machine), each taking the next test
    when it is free; none when the caller chose (`-n`, `--dist`, `-p no:xdist`)."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist"
           for a in extra_args):
        return []
    return ["-n", str(os.cpu_count() or 1), "--dist", "worksteal"]


def run_tests(extra_args: list[str], venv_dir: Path | None = None) -> int:
    """Lint (ruff), architecture contracts (import-linter), then the pytest suite."""
    bin_dir = (venv_dir or VENV) / "bin"
    for step in ([str(bin_dir / "ruff"), "check", "tui", "tests"],
                 [str(bin_dir / "lint-imports")]):
        print(f"bootstrap: {Path(step[0]).name} {' '.join(step[1:])}",
              flush=True)
        if subprocess.run(step, cwd=ROOT).returncode != 0:
            return 1
    return subprocess.run([str(_python(venv_dir)), "-m", "pytest", *_workers(extra_args),
                           *extra_args], cwd=ROOT).returncode


def _versions(lines: str) -> dict[str, str]:
    """`name==version` lines (uv export, uv pip freeze) as {normalised name: version}."""
    found = {}
    for line in lines.splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith(("#", " ", "-")):
            found[name.strip().lower().replace("_", "-")] = version.replace(";", " ").split()[0]
    return found


def drift(locked: dict[str, str], latest: dict[str, str]) -> str:
    """The installed packages whose newest allowed version differs from the lock (or that the
    lock lacks), as one line. The lock's packages for other Pythons or platforms (tomli on
    3.10, colorama on Windows) are not installed here, and are no drift."""
    moved = [f"{name} {locked.get(name, '—')} → {version}"
             for name, version in sorted(latest.items())
             if locked.get(name) != version and name != "specconsole"]
    return ", ".join(moved) or "none"


def run_latest(extra_args: list[str]) -> int:
    """The suite in a throw-away venv with the newest versions the ranges allow; on failure,
    one line naming the packages that differ from uv.lock (refresh it: README)."""
    uv = ensure_uv()
    with tempfile.TemporaryDirectory(prefix="specconsole-latest-") as tmp:
        latest_venv = Path(tmp) / "venv"
        env = _uv_env(latest_venv)
        # every uv call names its interpreter: uv pip acts on UV_PYTHON (this interpreter,
        # outside any venv) unless told which one
        target = ["--python", str(_python(latest_venv))]
        subprocess.run([str(uv), "venv", "--quiet", "--python", sys.executable,
                        str(latest_venv)], env=env, check=True)
        subprocess.run([str(uv), "pip", "install", "--quiet", "--upgrade", *target, "-e",
                        ".[test]"], cwd=ROOT, env=env, check=True)
        locked = _versions(subprocess.run(
            [str(uv), "export", "--frozen", "--no-hashes", "--extra", "test", "--quiet"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout)
        latest = _versions(subprocess.run([str(uv), "pip", "freeze", *target], cwd=ROOT,
                                          env=env, check=True, capture_output=True,
                                          text=True).stdout)
        moved = drift(locked, latest)
        print(f"bootstrap: newest allowed versions that differ from uv.lock: {moved}",
              flush=True)
        code = run_tests(extra_args, latest_venv)
    if code != 0:
        print(f"bootstrap: the suite fails with the newest dependencies (exit {code}); "
              f"moved since uv.lock: {moved} — fix, then refresh the lock (`uv lock --upgrade`)",
              file=sys.stderr)
    return code


def _lane_tests(lane: str, marker: str, path: str, figures_env: str, extra_args: list[str],
                env: dict[str, str] | None = None, as_json: bool = False) -> int:
    """The lane's tests (`-m marker` under `path`), then the figures they measured, one
    `<lane> lane: NAME: VALUE` line each."""
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "figures.json"
        code = subprocess.run(
            [str(_python()), "-m", "pytest", "-m", marker, path, *extra_args], cwd=ROOT,
            env={**os.environ, **(env or {}), figures_env: str(figures)}).returncode
        if figures.exists():
            for name, value in sorted(json.loads(figures.read_text()).items()):
                shown = json.dumps(value) if as_json else value
                print(f"{lane} lane: {name}: {shown}", flush=True)
    return code


def run_vllm_lane(extra_args: list[str]) -> int:
    """Make (or reuse) the vLLM environment and docker (the same vLLM also runs in a container
    of the container lane's image), then run the tests marked `vllm` and print the figures
    they measured. A setup failure is its one line and exit 1: never a quiet skip."""
    started = time.monotonic()
    setup = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_lane" / "setup_env.py")],
                           cwd=ROOT)
    if setup.returncode != 0:
        return setup.returncode
    if not ensure_docker("vllm"):
        return 1
    with slurm_cluster("vllm") as env:  # one case runs vLLM inside a Slurm job
        if env is None:
            return 1
        code = _lane_tests("vllm", "vllm", "tests/test_vllm_lane.py", "SPECCONSOLE_VLLM_FIGURES",
                           extra_args, env)
    print(f"vllm lane: {time.monotonic() - started:.0f} s in all", flush=True)
    return code


LAB_TOOLS = {"/usr/sbin/sshd": "openssh-server", "ip": "iproute2", "nft": "nftables"}
# The tests build the NVML stand-in (tui/sim/nvml) with the host's C compiler.
TEST_TOOLS = {"cc": "gcc"}
POLICY_RC = Path("/usr/sbin/policy-rc.d")
APT_LOCK_WAIT_S = 600


def _missing(tools: dict[str, str]) -> list[str]:
    return [pkg for tool, pkg in tools.items()
            if not (os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool))]


def apt_get(step: list[str], env: dict[str, str],
            sleep: Callable[[float], None] = time.sleep) -> subprocess.CompletedProcess[str]:
    """One apt-get step; while another apt (an unattended upgrade, a second lane) holds a lock
    it needs, asked again, for up to APT_LOCK_WAIT_S. (DPkg::Lock::Timeout makes `install` wait
    for dpkg's lock, but `update` fails at once on the lists' lock: tried.)"""
    deadline = time.monotonic() + APT_LOCK_WAIT_S
    while True:
        done = subprocess.run(step, env=env, capture_output=True, text=True)
        if (done.returncode == 0 or "Could not get lock" not in done.stderr
                or time.monotonic() > deadline):
            return done
        sleep(2.0)


def ensure_packages(tools: dict[str, str]) -> str | None:
    """Install the Debian packages of missing tools with apt-get; why not, as one line, or
    None. A policy-rc.d (exit 101) stops a package from starting a system sshd meanwhile."""
    missing = _missing(tools)
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"{', '.join(missing)} missing and not root to install them"
    print(f"bootstrap: apt-get install {' '.join(missing)}", flush=True)
    own_policy = not POLICY_RC.exists()
    if own_policy:
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        wait = ["-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}"]
        for step in (["apt-get", *wait, "update", "-q"],
                     ["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends",
                      *missing]):
            done = apt_get(step, env)
            if done.returncode != 0:
                last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["?"]
                return f"{' '.join(step[:2])} failed: {last[0]}"
    finally:
        if own_policy:
            POLICY_RC.unlink(missing_ok=True)
    still = _missing(tools)
    return f"still missing after apt-get: {', '.join(still)}" if still else None


# The lab's Ray environment: a real Ray (the CPU wheel from the package index) for the
# multi-host Ray cases, the agent's modules, and this checkout (editable: the simulated engine
# the hosts run, whose ranks become Ray actors). Made once outside the repository, reused.
LAB_ENV_VAR = "SPECCONSOLE_LAB_ENV"
LAB_RAY = ("ray[default]==2.60.0", "psutil", "nvidia-ml-py")


def lab_env_dir() -> Path:
    configured = os.environ.get(LAB_ENV_VAR)
    return Path(configured).expanduser() if configured else (
        Path.home() / ".cache" / "specconsole" / "lab-ray")


def _step(argv: list[str], what: str) -> str | None:
    """None when the step succeeded, else one line: what failed and pip's last word."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    noise = ("is ignored: it is neither a file nor a directory", "[notice]")
    said = [ln.strip() for ln in (done.stderr + done.stdout).splitlines()
            if ln.strip() and not any(n in ln for n in noise)]
    return f"{what} failed (exit {done.returncode}): {said[-1] if said else 'no output'}"


def ensure_lab_env() -> tuple[Path | None, str]:
    """Make or reuse the lab's Ray venv (lab_env_dir()/venv); (its directory, what was done)
    or (None, why not, one line). Reused while its stamp (the requirements, this checkout,
    pyproject.toml) matches and it still imports ray, psutil, pynvml and this checkout's tui."""
    root = lab_env_dir()
    env = root / "venv"
    python = env / "bin" / "python"
    stamp = env / ".specconsole-lab"
    digest = hashlib.sha256("\n".join([*LAB_RAY, str(ROOT)]).encode()
                            + (ROOT / "pyproject.toml").read_bytes()).hexdigest()
    probe = [str(python), "-c", "import ray, psutil, pynvml, tui; print(tui.__file__)"]
    if stamp.exists() and stamp.read_text() == digest and (env / "bin" / "ray").exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip().startswith(str(ROOT)):
            return root, "reused"
    started = time.monotonic()
    print(f"bootstrap: making the lab's Ray environment in {env}", flush=True)
    if not python.exists():
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(env)
        except (subprocess.CalledProcessError, OSError) as exc:
            return None, f"cannot create the venv {env}: {exc}"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for argv, what in ((([*pip, *LAB_RAY]), f"pip install {' '.join(LAB_RAY)}"),
                       ([*pip, "--no-deps", "-e", str(ROOT)], "pip install -e (this checkout)")):
        why = _step(argv, what)
        if why is not None:
            return None, why
    done = subprocess.run(probe, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"the lab's Ray environment does not import: {last}"
    stamp.write_text(digest)
    return root, f"made in {time.monotonic() - started:.0f} s"


# Each runtime's tools and their Debian packages: podman's `--init` runs catatonit, which
# Debian's podman only recommends (`podman run --init` fails without it).
CONTAINER_TOOLS = {"docker": {"docker": "docker.io", "dockerd": "docker.io"},
                   "podman": {"podman": "podman", "/usr/libexec/podman/catatonit": "catatonit"}}


def ensure_docker(lane: str, runtimes: tuple[str, ...] = ("docker",)) -> bool:
    """Each runtime's packages installed when missing (as root), dockerd started when `docker
    info` fails, `podman info` answering, the lane's image built locally in each runtime's store
    (tests/containers/setup_docker.py; no registry). False after the one line `<lane> lane
    setup: why`."""
    for runtime in runtimes:
        why = ensure_packages(CONTAINER_TOOLS[runtime])
        if why is not None:
            print(f"{lane} lane setup: {why}", file=sys.stderr)
            return False
    setup = ROOT / "tests" / "containers" / "setup_docker.py"
    return subprocess.run([str(_python()), str(setup), lane, *runtimes],
                          cwd=ROOT).returncode == 0


def run_lab_lane(extra_args: list[str]) -> int:
    """The fault lab: real sshd hosts in network namespaces, faults injected mid-load. A setup
    failure is its one line and exit 1; the figures the tests measured are printed."""
    started = time.monotonic()
    why = ensure_packages(LAB_TOOLS)
    if why is not None:
        print(f"lab lane setup: {why}", file=sys.stderr)
        return 1
    if not ensure_docker("lab"):  # the container case runs on a lab host
        return 1
    lab_env, how = ensure_lab_env()
    if lab_env is None:
        print(f"lab lane setup: {how}", file=sys.stderr)
        return 1
    print(f"lab lane: Ray environment {lab_env} ({how})", flush=True)
    code = _lane_tests("lab", "lab", "tests/lab", "SPECCONSOLE_LAB_FIGURES", extra_args,
                       {"SPECCONSOLE_LAB": "1", LAB_ENV_VAR: str(lab_env),
                        "SPECCONSOLE_VENV": str(VENV)}, as_json=True)
    print(f"lab lane: {time.monotonic() - started:.0f} s in all", flush=True)
    return code


def run_containers_lane(extra_args: list[str]) -> int:
    """The simulated engine in docker containers, through the real daemon, and in podman's
    (ensure_docker), then the tests marked `containers`. A setup failure is its one line and
    exit 1: never a skip."""
    started = time.monotonic()
    if not ensure_docker("container", ("docker", "podman")):
        return 1
    code = _lane_tests("container", "containers", "tests/containers",
                       "SPECCONSOLE_CONTAINERS_FIGURES", extra_args)
    print(f"container lane: {time.monotonic() - started:.0f} s in all", flush=True)
    return code


# The Slurm lane's cluster (tests/slurm/slurmlab.py): Debian's Slurm 22.05 and munge; slurmd
# joins each node's network namespace with nsenter (util-linux); the login node over SSH and
# the nodes' sshd are the fault lab's (LAB_TOOLS).
SLURM_TOOLS = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm",
               "munged": "munge", "ip": "iproute2", "nsenter": "util-linux",
               "iptables": "iptables", **LAB_TOOLS}


SLURM_CONF_ENV = "SPECCONSOLE_SLURM_CONF"  # where the lanes' tests find the cluster


@contextlib.contextmanager
def slurm_cluster(lane: str) -> Iterator[dict[str, str] | None]:
    """The Slurm lane's cluster up on this machine (munged, slurmctld, one slurmd per node in
    its own network namespace: tests/slurm/slurmlab.py), its packages installed when missing,
    for the tests of `lane` (the environment that finds it); taken down after. None after the
    one line `<lane> lane setup: why`."""
    why = ensure_packages(SLURM_TOOLS)
    if why is not None:
        print(f"{lane} lane setup: {why}", file=sys.stderr)
        yield None
        return
    lab = ROOT / "tests" / "slurm" / "slurmlab.py"
    with tempfile.TemporaryDirectory(prefix="specconsole-slurm-") as tmp:
        # it prints its figures, or its one line `slurm lane setup: why`
        if subprocess.run([sys.executable, str(lab), "up", tmp], cwd=ROOT).returncode != 0:
            yield None
            return
        try:
            yield {SLURM_CONF_ENV: str(Path(tmp) / "slurm.conf")}
        finally:
            subprocess.run([sys.executable, str(lab), "down", tmp], cwd=ROOT)


def run_slurm_lane(extra_args: list[str]) -> int:
    """A real Slurm cluster on this machine (slurm_cluster) and the lab's Ray venv (for Ray
    started inside an allocation), then the tests marked `slurm` against the cluster, then the
    cluster taken down. A setup failure is its one line and exit 1: never
    a skip."""
    started = time.monotonic()
    ray_env, how = ensure_lab_env()  # Ray started inside a job's allocation
    if ray_env is None:
        print(f"slurm lane setup: {how}", file=sys.stderr)
        return 1
    print(f"slurm lane: Ray environment {ray_env} ({how})", flush=True)
    with slurm_cluster("slurm") as env:
        if env is None:
            return 1
        code = _lane_tests("slurm", "slurm", "tests/slurm", "SPECCONSOLE_SLURM_FIGURES",
                           extra_args, {**env, LAB_ENV_VAR: str(ray_env)})
    print(f"slurm lane: {time.monotonic() - started:.0f} s in all", flush=True)
    return code


def run_train(extra_args: list[str]) -> int:
    """The root-cause ranking (tests/corpus/train.py): grouped cross-validation figures beside
    the hand rule's, the sealed part's; `--check` fails when tui/core/ranking.txt is stale,
    `--write` retrains it."""
    return subprocess.run([str(_python()), str(ROOT / "tests" / "corpus" / "train.py"),
                           *extra_args], cwd=ROOT).returncode


def run_score(extra_args: list[str]) -> int:
    """The real-log corpus score (tests/corpus/score.py): it prints the figures and fails only
    when a log makes `explain` raise, never on a score; then wrapper invariance over the whole
    corpus (tests/corpus/wrapped.py --check), failing below its floor."""
    corpus = ROOT / "tests" / "corpus"
    code = subprocess.run([str(_python()), str(corpus / "score.py"), *extra_args],
                          cwd=ROOT).returncode
    kept = subprocess.run([str(_python()), str(corpus / "wrapped.py"), "--check"],
                          cwd=ROOT).returncode
    return code or kept


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "score", "train", "lab", "vllm",
                                   "containers", "slurm"):
        print("usage: python3 -m tui.bootstrap demo [demo options] | test [--latest] [pytest "
              "options] | score [--show] | train [--check|--write] | lab [pytest options] | "
              "vllm [pytest options] | containers [pytest options] | slurm [pytest options]",
              file=sys.stderr)
        return 2
    if argv[0] == "demo":
        ensure_installed()
        return subprocess.run([str(VENV / "bin" / "specconsole"), "demo", *argv[1:]],
                              cwd=ROOT).returncode
    if argv[0] == "train":
        ensure_installed("test", "train")
        return run_train(argv[1:])
    ensure_installed("test")
    why = ensure_packages(TEST_TOOLS)
    if why is not None:
        print(f"bootstrap: {why} (the tests build the NVML stand-in with a C compiler)",
              file=sys.stderr)
        return 1
    if argv[0] == "score":
        return run_score(argv[1:])
    if argv[0] == "vllm":
        return run_vllm_lane(argv[1:])
    if argv[0] == "lab":
        return run_lab_lane(argv[1:])
    if argv[0] == "containers":
        return run_containers_lane(argv[1:])
    if argv[0] == "slurm":
        return run_slurm_lane(argv[1:])
    if argv[1:2] == ["--latest"]:
        return run_latest(argv[2:])
    return run_tests(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
