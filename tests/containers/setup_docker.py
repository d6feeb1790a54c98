"""The container lane's setup (stdlib only): a runtime that answers (docker: a running daemon;
podman: daemonless, `podman info`) and the lane's image in that runtime's store.

No registry is reachable, so the image is made here with `docker import` (`podman import`: the
same skeleton, the same tag) of a skeleton root file system (a few directories and the
usr-merge links, a few KB): its containers bind-mount the host's /usr, the Python that runs
the simulated engine and this checkout, read-only (see tests/containers/conftest.py). Its
ENTRYPOINT is the simulated `vllm serve`, so a profile with entrypoint = "image" has the shape
of `docker run vllm/vllm-openai --model ...`.
Run: `python3 tests/containers/setup_docker.py [LANE [RUNTIME ...]]` (prints `LANE lane: NAME:
VALUE` lines, LANE "container" unless named, e.g. "lab", whose container case needs the same;
RUNTIME docker unless named; one line and exit 1 when it cannot set up).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

IMAGE = "specconsole-lane:sim"
DAEMON_WAIT = 60.0  # seconds for a started dockerd to answer


class SetupError(Exception):
    """One line: why the lane cannot run here."""


def _answers(runtime: str) -> bool:
    try:
        return subprocess.run([runtime, "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_podman() -> str:
    """podman has no daemon: its client answers `podman info` or the lane cannot run."""
    if shutil.which("podman") is None:
        raise SetupError("podman is not installed (apt-get install podman catatonit)")
    if not _answers("podman"):
        said = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=30)
        last = (said.stderr.strip() or said.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise SetupError(f"podman info fails: {last[0]}")
    return "podman answers (no daemon)"


def ensure_daemon() -> str:
    """A daemon that answers `docker info`: the running one, else dockerd started here (as
    root), its log in a temp dir; how it was had."""
    if shutil.which("docker") is None:
        raise SetupError("the docker client is not installed (apt-get install docker.io)")
    if _answers("docker"):
        return "running already"
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        raise SetupError("docker does not answer and dockerd cannot be started here "
                         "(needs root and docker.io)")
    log = Path(tempfile.mkdtemp(prefix="specconsole-dockerd-")) / "dockerd.log"
    started = time.monotonic()
    with open(log, "ab") as out:
        subprocess.Popen(["dockerd"], stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    while not _answers("docker"):
        if time.monotonic() - started > DAEMON_WAIT:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty)"]
            raise SetupError(f"dockerd did not answer in {DAEMON_WAIT:g} s; its log {log} "
                             f"ends: {tail[0]}")
        time.sleep(0.2)
    return f"started dockerd in {time.monotonic() - started:.1f} s (log {log})"


def _skeleton() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, mode in (("etc", 0o755), ("tmp", 0o1777), ("proc", 0o755), ("sys", 0o755),
                           ("dev", 0o755), ("run", 0o755), ("root", 0o700), ("usr", 0o755),
                           ("sbin", 0o755)):  # sbin real: --init mounts /sbin/docker-init
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return data.getvalue()


def entrypoint(python: str) -> list[str]:
    return [python, "-m", "tui.sim.engine", "serve"]


def build_image(python: str, runtime: str = "docker") -> str:
    """IMAGE in `runtime`'s store (podman keeps its own: localhost/IMAGE, found by IMAGE),
    made from the skeleton with the simulated engine as its ENTRYPOINT."""
    started = time.monotonic()
    change = f"ENTRYPOINT {json.dumps(entrypoint(python))}"
    done = subprocess.run([runtime, "import", "--change", change, "-", IMAGE],
                          input=_skeleton(), capture_output=True, timeout=120)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()
        raise SetupError(f"{runtime} import failed: {said}")
    return f"{time.monotonic() - started:.2f} s"


READY = {"docker": ensure_daemon, "podman": ensure_podman}


def main(lane: str = "container", *runtimes: str) -> int:
    try:
        for runtime in runtimes or ("docker",):
            if runtime not in READY:
                raise SetupError(f"unknown runtime {runtime!r} (docker, podman)")
            label = "daemon" if runtime == "docker" else runtime
            print(f"{lane} lane: {label}: {READY[runtime]()}", flush=True)
            python = os.path.realpath(sys.executable)
            print(f"{lane} lane: {runtime} image {IMAGE} built in: "
                  f"{build_image(python, runtime)}", flush=True)
    except SetupError as exc:
        print(f"{lane} lane setup: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
