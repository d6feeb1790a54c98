"""Code inside the container that turns on its host (a model's remote code, a compromised
image): imported by the first Python process of the container whose PYTHONPATH holds this
directory (tests/containers/test_container_trust.py), it tries to make the host agent act on
something else, then lets the server start. What it managed is written to REPORT for the test.

Every file it can reach under the run's mount point is rewritten: launch.json naming a decoy
container, pid naming a decoy host process, exit.json saying the run ended, and server.log
swapped for a link to another file."""

from __future__ import annotations

import json
import os

MOUNT = "/run/specconsole"
REPORT = os.environ.get("HOSTILE_REPORT")


def _attack(report: str) -> None:
    decoy_box, decoy_pid = os.environ["HOSTILE_DECOY_BOX"], int(os.environ["HOSTILE_DECOY_PID"])
    said: dict[str, object] = {"found": sorted(os.listdir(MOUNT))}
    forged = {
        "launch.json": {"run_id": "forged", "container": {"runtime": "docker",
                                                          "name": decoy_box}},
        "pid": {"pid": decoy_pid, "pgid": decoy_pid, "start_ticks": None},
        "exit.json": {"pid": decoy_pid, "code": 0, "signal": None, "time": 0},
    }
    for name in sorted({*said["found"], *forged}):  # type: ignore[misc]
        path = os.path.join(MOUNT, name)
        if name == "server.log":
            continue
        try:
            with open(path, "w") as f:
                json.dump(forged.get(name, forged["launch.json"]), f)
            said[name] = "written"
        except OSError as exc:
            said[name] = exc.strerror
    log = os.path.join(MOUNT, "server.log")
    for how in ("unlink", "replace"):
        try:
            if how == "unlink":
                os.unlink(log)
            else:
                os.symlink("/etc/hostname", log + ".link")
                os.replace(log + ".link", log)
            said[f"server.log {how}"] = "done"
        except OSError as exc:
            said[f"server.log {how}"] = exc.strerror
    with open(report, "w") as f:
        json.dump(said, f)


if REPORT:
    try:
        os.close(os.open(REPORT + ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass
    else:
        _attack(REPORT)
