"""Helpers of the real-vLLM lane: the shipped profile made per-test (bare or in a docker
container), an independent death watch, and small HTTP calls. Imported by
tests/test_vllm_lane.py only."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from containers.setup_docker import IMAGE
from helpers import carriers, free_port

from tui.core.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "vllm-cpu-eagle3.toml"
SHADOW_DIR = Path(__file__).resolve().parent / "shadow"
LLAMA = "vllm.model_executor.models.llama"
_ONE_LINE_IMPORT = re.compile(r"from [\w.]+ import [\w, ]+\n")


def lane_profile(tmp: Path, name: str, scratch: Path, *, target: str = "local",
                 env: dict[str, str] | None = None, port: int | None = None,
                 edit: Callable[[str], str] | None = None) -> Profile:
    """The shipped profile, unchanged but for a free port (or `port`), a private runs dir, the
    target host, and extra server environment; `edit` changes its text further (one failure's
    argument); paths expand from this environment plus `scratch`."""
    text = PROFILE.read_text()
    text = re.sub(r"(?m)^port = \d+$", f"port = {port or free_port()}", text, count=1)
    text = text.replace('[host]\ntarget = "local"\n',
                        f'[host]\ntarget = "{target}"\nruns_dir = "{tmp / "runs"}"\n', 1)
    if env:
        extra = "".join(f'{k} = {json.dumps(v)}\n' for k, v in env.items())
        text = text.replace("[server.env]\n", "[server.env]\n" + extra, 1)
    if edit is not None:
        text = edit(text)
    path = tmp / f"{name}.toml"
    path.write_text(text)
    for sub in ("tmp", "cache", "inductor"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    return load_profile(path, {**os.environ, "SPECCONSOLE_VLLM_SCRATCH": str(scratch)})


def in_container(venv: Path, models: Path, scratch: Path, *extra: Path) -> Callable[[str], str]:
    """A profile edit: the server runs in a docker container of the container lane's image
    (tests/containers/setup_docker.py: a skeleton root, no Python of its own) with
    entrypoint = "command". The host's /usr and the venv's base Python are mounted read-only as
    that lane mounts them, so are the lane's venv, its models and `extra` (a shadow, a patched
    file), each at its host path; the scratch is writable. The profile's `listen = "127.0.0.1"`
    stays as it is: specconsole makes vLLM listen on every address of the container and
    publishes the port on the host's loopback only, where /health is asked."""
    base = Path(os.path.realpath(venv / "bin" / "python")).parent.parent
    volumes = ["/usr:/usr:ro", f"{base}:{base}:ro", f"{venv}:{venv}:ro",
               f"{models}:{models}:ro", *(f"{p}:{p}:ro" for p in extra), f"{scratch}:{scratch}"]

    def edit(text: str) -> str:
        assert 'listen = "127.0.0.1"\n' in text
        return text + f"""
[container]
runtime = "docker"
image = "{IMAGE}"
gpus = "none"
entrypoint = "command"
shm_size = "1g"
volumes = {json.dumps(volumes)}
"""
    return edit


def patched_llama(venv: Path, out: Path) -> tuple[Path, int]:
    """A copy of the installed llama.py whose first one-line `from … import a, b` gets a
    trailing comma: a broken import, a SyntaxError at a known line. The install is untouched."""
    source = next((venv / "lib").glob("python3*/site-packages/vllm/model_executor/models/llama.py"))
    lines = source.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if _ONE_LINE_IMPORT.match(ln))
    lines[at] = lines[at].rstrip("\n") + ",\n"
    out.mkdir(parents=True, exist_ok=True)
    patched = out / "llama.py"
    patched.write_text("".join(lines))
    return patched, at + 1


def shadow_env(patched: Path, scope: str) -> dict[str, str]:
    """Server environment that makes `scope` ("engine" or "all") import the patched copy."""
    return {"PYTHONPATH": str(SHADOW_DIR), "SPECCONSOLE_SHADOW_MODULE": LLAMA,
            "SPECCONSOLE_SHADOW_FILE": str(patched), "SPECCONSOLE_SHADOW_SCOPE": scope}


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return ""


def is_server_process(cmdline: str) -> bool:
    """vLLM's own processes: `vllm serve`, and what multiprocessing spawned (EngineCore and
    Worker, titled `VLLM::…` once they have set it); not the resource tracker nor the model
    inspection subprocess, which are helpers."""
    return (cmdline.startswith("VLLM::") or " serve " in cmdline
            or "multiprocessing.spawn" in cmdline)


@dataclass
class DeathWatch:
    """Independent of specconsole: finds the run's processes by SPECCONSOLE_RUN_ID and notes
    the moment each one dies with its own pidfds."""

    run_id: str
    deaths: dict[int, float] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # its last command line seen
    titles: dict[int, set[str]] = field(default_factory=dict)  # every command line seen
    parents: dict[int, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> DeathWatch:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def first_death(self, server_only: bool) -> tuple[int, str, float] | None:
        """(pid, cmdline, time) of the first death, of vLLM's own processes only or of any.
        A process last seen under a command line its parent had (forked, gone before its exec
        or its own title) is its parent's child, whatever that command line says."""
        dead = [(t, pid) for pid, t in self.deaths.items()
                if not server_only or (is_server_process(self.names.get(pid, ""))
                                       and not self._inherited(pid))]
        if not dead:
            return None
        t, pid = min(dead)
        return pid, self.names.get(pid, ""), t

    def _inherited(self, pid: int) -> bool:
        return self.names.get(pid) in self.titles.get(self.parents.get(pid, 0), set())

    def _see(self, pid: int) -> None:
        """Its command line now (titles change: spawn_main -> VLLM::EngineCore), and its
        parent's at first sight."""
        if pid not in self.parents:
            with contextlib.suppress(psutil.Error):
                self.parents[pid] = psutil.Process(pid).ppid()
            parent = self.parents.get(pid)
            if parent is not None and parent not in self.deaths:
                self.titles.setdefault(parent, set()).add(_cmdline(parent))
        self.names[pid] = _cmdline(pid) or self.names.get(pid, "")
        self.titles.setdefault(pid, set()).add(self.names[pid])

    def _loop(self) -> None:
        poller = select.poll()
        fds: dict[int, int] = {}
        try:
            while not self._stop.is_set():
                for pid in carriers(self.run_id):
                    if pid not in fds and pid not in self.deaths:
                        with contextlib.suppress(OSError):
                            fds[pid] = os.pidfd_open(pid)
                            poller.register(fds[pid], select.POLLIN)
                    if pid in fds:
                        self._see(pid)
                for fd, _ in poller.poll(50):
                    now = time.time()
                    pid = next(p for p, f in fds.items() if f == fd)
                    self.deaths[pid] = now
                    poller.unregister(fd)
                    os.close(fds.pop(pid))
        finally:
            for fd in fds.values():
                os.close(fd)


def http(port: int, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    """GET (or POST JSON) on the server; (status, text), status 0 when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError:
        return 0, ""


def port_free(port: int) -> bool:
    """Nothing listens, and a new server could bind it."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
