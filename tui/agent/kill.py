"""`kill` and `kill_pids`: TERM, KILL after the grace, sweep by run id, then verify that nothing
of the run remains and its GPU memory was released. A recycled pid is never hit."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from . import container
from .boxcheck import LABEL_RUN
from .nvml import Gpus
from .procfs import (
    alive,
    ancestors,
    list_pids,
    pgid_of,
    pidfd_supported,
    read_environ,
    read_stat,
)
from .rundir import Run
from .tracker import Proc, Tracker, env_members, lives
from .wire import AgentFailure, SpecError, emit, spec_value


def cmd_kill(spec: dict) -> int:
    """TERM (then CONT, for a stopped process) the run, KILL what survives the grace, sweep by
    run id, then verify.

    Never signalled: this agent, its ancestors and the monitor (`exclude`).  The process group
    is signalled as a whole only while a live member holds it (so its number is the run's) and
    no excluded process is in it; tracked processes are signalled through their pidfds, so a
    recycled pid is never hit.
    """
    run = Run(spec_value(spec, "run_dir", str))
    grace = float(spec_value(spec, "grace", (int, float), 10.0))
    if run.top_pid is None and (starting := run.starting()) is not None:
        _stop_start(run, starting, grace)
    exclude = ancestors(os.getpid())
    if run.monitor_pid is not None:
        exclude.add(run.monitor_pid)
    tracker = Tracker(run, pidfd_supported(), env_scan=False)
    tracker.scan()
    ever: set[int] = set(tracker.procs)  # every pid of the run seen, for the GPU check

    box = run.container
    if box is not None:  # the runtime's own TERM, KILL after the grace, to its main process
        emit("kill_step", step="TERM", pids=sorted(p.pid for p in tracker.alive()),
             time=time.time())
        container.stop(box["runtime"], box["name"], grace)  # what it left is verified below
        _wait_dead(tracker, time.monotonic() + 5)
    else:
        termed = _signal_members(tracker, exclude, signal.SIGTERM)
        # a stopped process (SIGSTOP, a debugger's hold) acts on its TERM only once continued
        _signal_members(tracker, exclude, signal.SIGCONT)
        emit("kill_step", step="TERM", pids=termed, time=time.time())
        _wait_dead(tracker, time.monotonic() + grace)

    tracker.scan()  # members that appeared during the grace
    ever |= set(tracker.procs)
    killed = _signal_members(tracker, exclude, signal.SIGKILL)
    emit("kill_step", step="KILL", pids=killed, time=time.time())
    _wait_dead(tracker, time.monotonic() + 5)

    swept: set[int] = set()
    for _ in range(3):
        found = [pid for pid in env_members(run, exclude)
                 if _signal_verified(pid, signal.SIGKILL, run.env_needle)]
        if not found:
            break
        swept |= set(found)
        _wait_pids(found, time.monotonic() + 5)
    ever |= swept
    emit("kill_step", step="SWEEP", pids=sorted(swept), time=time.time())

    if run.monitor_pid is not None:  # let the monitor record the top's end
        deadline = time.monotonic() + 3
        while (run.exit_info() is None and alive(run.monitor_pid)
               and time.monotonic() < deadline):
            time.sleep(0.02)
    me = os.getpid()  # a member itself when run from inside the run; gone in a moment
    remaining = {p.pid for p in tracker.alive() if lives(p) and p.pid != me} \
        | set(env_members(run, exclude))
    if box is not None:
        remaining |= _container_left(box, ours=run.attached is None)
    remaining = sorted(remaining)
    tracker.close()
    released, holders = _gpu_release(ever, time.monotonic() + min(10.0, grace + 2))
    emit("killed", remaining=remaining, gpu_released=released, gpu_holders=holders,
         time=time.time())
    return 0


def _stop_start(run: Run, starting: dict, grace: float) -> None:
    """The container is still being set up (its image pulled, `run -d` under way): TERM the
    monitor (the very process the marker names), which ends the pull, removes a container it
    had just started and records the run as killed; then wait until it says so (exit.json) or,
    if the container's pid was recorded meanwhile, go on as for any container."""
    pid, fd = starting["monitor_pid"], _pidfd(starting["monitor_pid"])
    try:
        if fd is None or not _is(pid, starting.get("start_ticks")):
            return
        emit("kill_step", step="TERM", pids=[pid], time=time.time())
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGTERM)
    finally:
        if fd is not None:
            os.close(fd)
    deadline = time.monotonic() + grace + container.RUN_TIMEOUT
    while run.exit_info() is None and alive(pid) and time.monotonic() < deadline:
        run.load_pid()
        if run.top_pid is not None:
            return
        time.sleep(0.02)
    run.load_pid()


def _container_left(box: dict, ours: bool) -> set[int]:
    """The container's main process while the runtime says it still runs (never "nothing
    remains" while it is up); an ended container of ours is removed, its exit read already
    (an attached one is left for its owner to remove)."""
    st = container.state(box["runtime"], box["name"])
    if st is None:
        return set()
    if st.get("Running") or st.get("Status") in ("running", "paused", "restarting"):
        pid = st.get("Pid")
        return {pid if isinstance(pid, int) and pid > 0 else -1}
    if ours:
        container.remove(box["runtime"], box["name"])
    return set()


def _signal_members(tracker: Tracker, exclude: set[int], sig: int) -> list[int]:
    """Signal the run's live processes (not `exclude`); the pids signalled, sorted."""
    targets = [p for p in tracker.alive() if p.pid not in exclude]
    group = tracker.run.pgid if tracker.group_is_ours() else None
    if group is not None and any(pgid_of(pid) == group for pid in exclude):
        group = None  # this agent or an ancestor is in the group: one by one instead
    if group is not None:
        with contextlib.suppress(OSError):
            os.killpg(group, sig)
    for proc in targets:
        if group is None or proc.pgid != group:
            _signal_proc(proc, sig)
    return sorted(p.pid for p in targets)


def _signal_proc(proc: Proc, sig: int) -> None:
    """Through the pidfd when we hold one: a pid recycled since cannot be hit."""
    with contextlib.suppress(OSError):
        if proc.pidfd is not None:
            signal.pidfd_send_signal(proc.pidfd, sig)
        else:
            os.kill(proc.pid, sig)


def _signal_verified(pid: int, sig: int, needle: bytes) -> bool:
    """Signal pid if its environ still carries `needle`, checked under a pidfd when possible
    (so the check and the signal are about the same process); True when signalled."""
    fd = None
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
    try:
        env = read_environ(pid)
        if env is None or needle not in env:
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _wait_dead(tracker: Tracker, deadline: float) -> None:
    """Until every known process died (pidfds, or stat polling without them) or the deadline."""
    while tracker.alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        step = 0.5 if all(p.pidfd is not None for p in tracker.alive()) else 0.02
        for fd, _ in tracker.poller.poll(min(left, step) * 1000):
            proc = tracker.by_fd.get(fd)
            if proc is not None:
                tracker.mark_dead(proc)
        for proc in tracker.poll_deaths():
            tracker.mark_dead(proc)


def _wait_pids(pids: list[int], deadline: float) -> None:
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _gpu_release(pids: set[int], deadline: float) -> tuple[bool | None, list[dict]]:
    """(released, holders): waits a little, since a killed process frees GPU memory late."""
    gpus = Gpus()
    if not gpus.ok:
        return None, []
    while True:
        holders = gpus.all_holders()
        for h in holders:
            h["run"] = h["pid"] in pids
        released = not any(h["run"] for h in holders)
        if released or time.monotonic() >= deadline:
            return released, holders
        time.sleep(0.2)


def cmd_kill_pids(spec: dict) -> int:
    """Kill GPU holders the preflight named (leftovers of ended runs), and leftover containers
    (`containers`: each stopped and removed by id), and nothing else.

    Each target is (pid, start_ticks) as the preflight saw it.  Right before TERM, a target must
    still be that very process (a pidfd opened, then its start time compared) and still hold GPU
    memory (NVML); once TERMed, the escalation follows it by its pidfd, so a recycled pid is
    never hit.  A container is stopped only while it still carries the run id the preflight
    saw.  Then KILL after the grace, and verify: which remain, whether their GPU memory was
    released.  Without NVML no pid can be verified, so none is signalled.
    """
    grace = float(spec_value(spec, "grace", (int, float), 10.0))
    wanted = []
    for target in spec_value(spec, "targets", list):
        pid, ticks = (target.get("pid"), target.get("start_ticks")) \
            if isinstance(target, dict) else (None, None)
        if not (isinstance(pid, int) and isinstance(ticks, int)) or pid <= 1:
            raise SpecError("each target needs an int pid (> 1) and start_ticks")
        wanted.append((pid, ticks))
    boxes = _leftover_boxes(spec_value(spec, "containers", list, []) or [])
    gpus = Gpus()
    if not gpus.ok and (wanted or not boxes):
        raise AgentFailure("nvml", f"cannot tell who holds GPU memory ({gpus.error}); "
                           "nothing was signalled")
    exclude = ancestors(os.getpid())
    held = {h["pid"] for h in gpus.all_holders()} if gpus.ok else set()
    live: dict[int, tuple[int | None, int]] = {}  # pid -> (pidfd or None, start ticks)
    skipped = []
    for pid, ticks in wanted:
        fd = _pidfd(pid)
        if pid in exclude or not _is(pid, ticks) or pid not in held:
            skipped.append(pid)
            if fd is not None:
                os.close(fd)
        else:
            live[pid] = (fd, ticks)
    in_boxes = {pid for box in boxes for pid in _box_pids(box)}
    if skipped:
        emit("kill_step", step="SKIP", pids=sorted(skipped), time=time.time())
    try:
        for pid, (fd, ticks) in live.items():
            _send(pid, fd, ticks, signal.SIGTERM)
        emit("kill_step", step="TERM", pids=sorted(set(live) | in_boxes), time=time.time())
        for box in boxes:  # the runtime's TERM, KILL after the grace, to the container
            container.stop(box["runtime"], box["id"], grace)
        _wait_gone(live, time.monotonic() + grace)
        survivors = sorted(p for p, (_, ticks) in live.items() if _is(p, ticks))
        for pid in survivors:
            _send(pid, *live[pid], signal.SIGKILL)
        emit("kill_step", step="KILL", pids=survivors, time=time.time())
        _wait_gone(live, time.monotonic() + 5)
        remaining = {p for p, (_, ticks) in live.items() if _is(p, ticks)}
    finally:
        for fd, _ in live.values():
            if fd is not None:
                os.close(fd)
    for box in boxes:
        remaining |= _container_left({"runtime": box["runtime"], "name": box["id"]}, ours=True)
    if not gpus.ok:
        emit("killed", remaining=sorted(remaining), gpu_released=None, gpu_holders=[],
             time=time.time())
        return 0
    released, holders = _gpu_release(set(live) | in_boxes,
                                     time.monotonic() + min(10.0, grace + 2))
    emit("killed", remaining=sorted(remaining), gpu_released=released, gpu_holders=holders,
         time=time.time())
    return 0


def _leftover_boxes(items: list) -> list[dict]:
    """The containers to stop: each still up and still labelled with the run id the preflight
    saw (a container id is never reused, the label makes sure it is that run's)."""
    boxes = []
    for item in items:
        if not (isinstance(item, dict) and item.get("runtime") in ("docker", "podman")
                and isinstance(item.get("id"), str) and isinstance(item.get("run_id"), str)):
            raise SpecError("each container needs a runtime, an id and a run_id")
        label = container.cli(item["runtime"], "inspect", "-f",
                              f'{{{{index .Config.Labels "{LABEL_RUN}"}}}}', item["id"])
        if label.returncode == 0 and label.stdout.strip() == item["run_id"]:
            boxes.append(item)
    return boxes


def _box_pids(box: dict) -> set[int]:
    """The host pids of the container's processes: its main process and every descendant."""
    st = container.state(box["runtime"], box["id"]) or {}
    top = st.get("Pid")
    if not isinstance(top, int) or top <= 0:
        return set()
    return {pid for pid in list_pids() if top in ancestors(pid)}


def _is(pid: int, ticks: int) -> bool:
    """pid is alive (not a zombie) and is the process that started at `ticks`."""
    st = read_stat(pid)
    return st is not None and not st.dead and st.start_ticks == ticks


def _pidfd(pid: int) -> int | None:
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _send(pid: int, fd: int | None, ticks: int, sig: int) -> None:
    """Through the pidfd, opened while the process was verified; without one, by pid right
    after checking its start time again."""
    with contextlib.suppress(OSError):
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        elif _is(pid, ticks):
            os.kill(pid, sig)


def _wait_gone(pids: dict[int, tuple[int | None, int]], deadline: float) -> None:
    while any(_is(p, ticks) for p, (_, ticks) in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.02)
