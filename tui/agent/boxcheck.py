"""Preflight on the host for a run in a container: the runtime answers this user, the image is
there (or may be pulled), the GPU runtime is installed when GPUs are asked for, rootless podman
lingers over SSH; and the running containers, so that a GPU holder or the port's owner inside
one is named by it, and a container of an ended run (a leftover) can be offered for killing.

Every message is one line with the fix; the words are pure functions (tested by tables).
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import container
from .procfs import ancestors
from .rundir import Run
from .wire import AgentFailure

TIMEOUT = 15.0  # seconds for one runtime call during preflight
LABEL_RUN = "specconsole.run_id"  # as tui.core.container.LABEL_RUN
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
INSTALL = {"docker": "sudo apt-get install docker.io", "podman": "sudo apt-get install podman"}
GPU_FIX = {
    "docker": "install nvidia-container-toolkit, then `sudo nvidia-ctk runtime configure "
              "--runtime=docker` and restart dockerd",
    "podman": "install nvidia-container-toolkit, then `sudo nvidia-ctk cdi generate "
              "--output=/etc/cdi/nvidia.yaml`",
}

Add = Callable[..., None]


@dataclass(frozen=True, slots=True)
class Running:
    """One running container, as `inspect` describes it."""

    id: str
    name: str
    image: str
    pid: int | None  # its main process's host pid
    run_id: str | None  # the specconsole.run_id label
    started: float | None  # epoch
    ports: frozenset[int] = field(default_factory=frozenset)  # host ports it publishes

    def words(self, now: float) -> str:
        up = f", up {age_words(now - self.started)}" if self.started is not None else ""
        return f"container {self.name} ({self.image}{up})"


def runtime_problem(runtime: str, output: str, user: str) -> str:
    """Why `<runtime> info` failed, in one line with the fix."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    first = lines[0] if lines else "no output"
    low = output.lower()
    if runtime == "docker" and "permission denied" in low:
        return (f"permission denied on the docker socket for user {user} ({first}): add the "
                "user to the docker group (`sudo usermod -aG docker $USER`), then log in again")
    if runtime == "docker" and ("cannot connect" in low or "is the docker daemon running" in low):
        return (f"the docker daemon does not answer ({first}): start it "
                "(`sudo systemctl start docker`)")
    if runtime == "podman" and any(w in low for w in ("newuidmap", "subuid", "subgid",
                                                      "user namespace")):
        return (f"rootless podman is not set up for user {user} ({first}): give the user "
                "subordinate ids (`sudo usermod --add-subuids 100000-165535 --add-subgids "
                "100000-165535 $USER`), then `podman system migrate`")
    return f"`{runtime} info` failed: {first}"


def image_words(runtime: str, image: str, present: bool, pull: str) -> tuple[bool, str, str]:
    """(ok, severity, message) for the image: present, absent and to be pulled, or refused."""
    if present:
        return True, "error", f"image {image} is on this host"
    if pull == "never":
        return False, "error", (f"image {image} is not on this host and container.pull = "
                                f"\"never\": pull it (`{runtime} pull {image}`) or fix the name")
    return False, "warning", (f"image {image} is not on this host: the launch pulls it first "
                              f"(`{runtime} pull {image}`)")


def gpu_runtime_words(runtime: str, runtimes: list[str], cdi_specs: list[str],
                      hook: str | None) -> tuple[bool, str]:
    """Whether `--gpus` (docker) / `--device nvidia.com/gpu=...` (podman) can work here."""
    if runtime == "docker" and "nvidia" in runtimes:
        return True, "docker lists the nvidia runtime"
    if cdi_specs:
        return True, f"CDI specs: {', '.join(cdi_specs)}"
    if runtime == "docker" and hook:
        return True, f"nvidia-container-runtime-hook found ({hook})"
    where = "docker lists no nvidia runtime and there are" if runtime == "docker" else "there are"
    return False, (f"GPUs are asked for but {where} no CDI specs in {' or '.join(CDI_DIRS)}: "
                   f"{GPU_FIX[runtime]}")


def linger_words(output: str, user: str) -> tuple[bool, str]:
    """`loginctl show-user USER -p Linger`'s answer: a rootless container started over SSH dies
    with the SSH session unless the user lingers."""
    value = output.strip().partition("Linger=")[2].strip()
    if value == "yes":
        return True, f"lingering is enabled for {user}: the container outlives the SSH session"
    return False, (f"lingering is not enabled for {user}: rootless podman's container dies "
                   "with the SSH session — `loginctl enable-linger $USER`")


def age_words(seconds: float) -> str:
    minutes = max(0, int(seconds // 60))
    if minutes < 1:
        return "less than a minute"
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 48 * 60:
        return f"{minutes // 60} h {minutes % 60} min"
    return f"{minutes // (24 * 60)} days"


_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?")


def parse_started(stamp: str) -> float | None:
    """docker's / podman's StartedAt (RFC 3339, nanoseconds) as epoch seconds."""
    found = _STAMP.match(stamp or "")
    if found is None or found.group(1) == "0001":  # never started
        return None
    epoch = calendar.timegm((*(int(found.group(i)) for i in range(1, 7)), 0, 0, 0))
    zone = found.group(7)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        epoch -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return float(epoch)


def parse_inspect(text: str) -> list[Running]:
    """`<runtime> inspect ID...` (a JSON array) as Running entries; what cannot be read is
    skipped."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("Id"), str):
            continue
        config = item.get("Config") or {}
        state = item.get("State") or {}
        labels = config.get("Labels") or {}
        pid = state.get("Pid")
        out.append(Running(
            id=item["Id"], name=str(item.get("Name") or item["Id"][:12]).lstrip("/"),
            image=str(config.get("Image") or item.get("ImageName") or "?"),
            pid=pid if isinstance(pid, int) and pid > 0 else None,
            run_id=labels.get(LABEL_RUN) if isinstance(labels.get(LABEL_RUN), str) else None,
            started=parse_started(str(state.get("StartedAt") or "")),
            ports=frozenset(_host_ports(item))))
    return out


def _host_ports(item: dict) -> set[int]:
    """The host ports a container publishes (`-p`); with --network host, none: its processes
    listen on the host themselves (their pids name it)."""
    ports = set()
    for source in ((item.get("NetworkSettings") or {}).get("Ports"),
                   (item.get("HostConfig") or {}).get("PortBindings")):
        for bindings in (source or {}).values():
            for binding in bindings or []:
                with contextlib.suppress(AttributeError, TypeError, ValueError):
                    ports.add(int(binding.get("HostPort")))
    return ports


class Containers:
    """The runtime's running containers, to name the one a host pid runs in."""

    def __init__(self, running: list[Running]) -> None:
        self.running = running
        self.by_pid = {r.pid: r for r in running if r.pid is not None}

    @classmethod
    def list(cls, runtime: str) -> Containers:
        ids = container.cli(runtime, "ps", "-q", "--no-trunc", timeout=TIMEOUT).stdout.split()
        if not ids:
            return cls([])
        return cls(parse_inspect(container.cli(runtime, "inspect", *ids,
                                               timeout=TIMEOUT).stdout))

    def holding(self, pid: int) -> Running | None:
        """The container whose main process is pid or one of its ancestors."""
        return next((self.by_pid[p] for p in ancestors(pid) if p in self.by_pid), None)

    def publishing(self, port: int) -> Running | None:
        return next((r for r in self.running if port in r.ports), None)


def check_container(spec: dict, add: Add, runs_dir: str | None) -> Containers | None:
    """The [container] checks; the running containers when the runtime answered."""
    runtime = spec["runtime"]
    user = _user()
    if shutil.which(runtime) is None:
        add("container runtime", False, f"{runtime} is not installed on this host (or not on "
            f"the agent's PATH): install it (`{INSTALL.get(runtime, runtime)}`)")
        return None
    try:
        done = container.cli(runtime, "info", "--format", "{{json .}}", timeout=TIMEOUT)
    except AgentFailure as exc:  # no answer in TIMEOUT
        add("container runtime", False, f"{exc} — `sudo systemctl status {runtime}`")
        return None
    if done.returncode != 0:
        add("container runtime", False,
            runtime_problem(runtime, done.stderr + done.stdout, user))
        return None
    try:
        info = json.loads(done.stdout)
    except ValueError:
        info = {}
    info = info if isinstance(info, dict) else {}
    version = info.get("ServerVersion") or (info.get("version") or {}).get("Version") or "?"
    add("container runtime", True, f"{runtime} {version} answers for user {user}")
    _check_image(runtime, spec["image"], str(spec.get("pull") or "missing"), add)
    if spec.get("gpus"):
        runtimes = list((info.get("Runtimes") or {}).keys()) if runtime == "docker" else []
        ok, message = gpu_runtime_words(runtime, runtimes, _cdi_specs(),
                                        shutil.which("nvidia-container-runtime-hook"))
        add("gpu runtime", ok, message)
    if runtime == "podman" and os.getuid() != 0 and spec.get("over_ssh"):
        _check_linger(user, add)
    try:
        found = Containers.list(runtime)
    except AgentFailure as exc:
        add("containers", False, f"cannot list the running containers: {exc}", "warning")
        return None
    _check_leftovers(runtime, found, runs_dir, add)
    return found


def _check_image(runtime: str, image: str, pull: str, add: Add) -> None:
    done = container.cli(runtime, "image", "inspect", "-f", "{{.Id}}", image, timeout=TIMEOUT)
    said = (done.stderr or done.stdout).strip()
    if done.returncode != 0 and not any(w in said.lower() for w in ("no such image",
                                                                    "image not known")):
        first = said.splitlines()[0] if said else f"exit code {done.returncode}"
        add("image", False, f"cannot inspect image {image}: {first}")
        return
    ok, severity, message = image_words(runtime, image, done.returncode == 0, pull)
    add("image", ok, message, severity)


def _cdi_specs() -> list[str]:
    found = []
    for folder in CDI_DIRS:
        with contextlib.suppress(OSError):
            found += [os.path.join(folder, f) for f in sorted(os.listdir(folder))
                      if f.endswith((".yaml", ".yml", ".json"))]
    return found


def _check_linger(user: str, add: Add) -> None:
    if shutil.which("loginctl") is None:
        add("linger", False, "loginctl not found: cannot tell whether rootless podman's "
            "container outlives the SSH session (`loginctl enable-linger $USER` where systemd "
            "runs)", "warning")
        return
    try:
        done = subprocess.run(["loginctl", "show-user", user, "-p", "Linger"],
                              capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        add("linger", False, "loginctl did not answer: cannot tell whether lingering is "
            "enabled (`loginctl enable-linger $USER`)", "warning")
        return
    ok, message = linger_words(done.stdout, user)
    add("linger", ok, message)


def _check_leftovers(runtime: str, found: Containers, runs_dir: str | None, add: Add) -> None:
    """A running container labelled with a run of this runs_dir that has ended: a leftover,
    offered to --kill-leftovers / K (by id, stopped then removed)."""
    if not runs_dir:
        return
    now = time.time()
    leftovers = []
    for box in found.running:
        if box.run_id is None or "/" in box.run_id or box.run_id in (".", ".."):
            continue
        try:
            run = Run(os.path.join(os.path.expanduser(runs_dir), box.run_id))
        except AgentFailure:  # not a run of this runs_dir: named where it holds something
            continue
        if not run.top_alive():
            leftovers.append((box, f"{box.words(now)} of run {box.run_id}, which has ended"))
    if leftovers:
        add("leftover containers", False,
            "; ".join(text for _, text in leftovers) + ": leftovers",
            containers=[{"runtime": runtime, "id": box.id, "name": box.name,
                         "run_id": box.run_id} for box, _ in leftovers])


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
