"""The kill's escalation on a simulated server that resists it (issue 4, item 7), locally.

`--sim-ignore-sigterm`: every process of the server ignores SIGTERM, as one wedged in a
collective does, so only the KILL after the grace ends it. `--sim-escapee`: one more process of
the run left its session and process group (setsid, reparented to init) and holds GPU memory;
only the sweep by SPECCONSOLE_RUN_ID can find it. Afterwards no process of the run remains and
the fake NVML shows every byte released. The same through the real sshd: tests/lab.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
from helpers import carriers, sim_profile
from test_leftovers import holders, with_args

from tui.core.profile import load_profile
from tui.sim.escapee import NAME as ESCAPEE
from tui.supervise.supervisor import Supervisor

GRACE_S = 1.5


def escapee_of(run_id: str) -> int | None:
    for pid in carriers(run_id):
        try:
            if psutil.Process(pid).name() == ESCAPEE:
                return pid
        except psutil.Error:
            continue
    return None


async def test_term_ignored_is_killed_after_the_grace_and_the_escapee_is_swept(
        tmp_path: Path, cleanup: list[str]) -> None:
    profile = with_args(sim_profile(tmp_path, "ready", time_scale=60),
                        "--sim-ignore-sigterm", "--sim-escapee")
    sup = Supervisor(load_profile(profile))
    try:
        run = await sup.launch(skip_preflight=True)
        cleanup.append(run.run_id)
        deadline = time.monotonic() + 30
        while len(holders(tmp_path / "gpus")) < 9 or escapee_of(run.run_id) is None:
            assert time.monotonic() < deadline, "8 workers and the escapee never held memory"
            await asyncio.sleep(0.05)
        escapee = escapee_of(run.run_id)
        assert escapee is not None
        assert os.getsid(escapee) != os.getsid(run.pid)  # left the session and the group
        assert os.getpgid(escapee) != os.getpgid(run.pid)
        assert psutil.Process(escapee).ppid() not in carriers(run.run_id)  # nobody's child
        workers = [pid for pid in holders(tmp_path / "gpus") if pid != escapee]
        killed = await sup.kill(GRACE_S)
        steps = {s.step: s for s in sup.last_kill_steps}
        assert list(steps) == ["TERM", "KILL", "SWEEP"]
        assert run.pid in steps["TERM"].pids and set(workers) <= set(steps["TERM"].pids)
        assert escapee not in steps["TERM"].pids  # not a member of the group or the tree
        # nobody obeyed TERM: every worker was still there for the KILL, after the grace
        assert set(workers) <= set(steps["KILL"].pids)
        assert steps["KILL"].time - steps["TERM"].time >= GRACE_S
        assert list(steps["SWEEP"].pids) == [escapee]
        assert killed.remaining == () and killed.gpu_released is True
        assert not [h for h in killed.gpu_holders if h.get("run")]
        assert carriers(run.run_id) == []
        assert holders(tmp_path / "gpus") == {}  # the fake NVML: all memory released
    finally:
        await sup.close()
