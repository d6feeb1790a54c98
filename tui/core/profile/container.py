"""`[container]`: the server in a container of an image, and the `docker run` words that
would break what specconsole relies on."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tui.core.profile.checks import (
    Table,
    _bounded,
    _describe,
    _int,
    _Invalid,
    _list,
    _one_of,
    _section,
    _str,
)

RUNTIMES = ("docker", "podman")
# "image": the image's ENTRYPOINT takes [server]'s arguments (`docker run vllm/vllm-openai
# --model ...`); "command": the server command built from [server] runs in the container
ENTRYPOINTS = ("image", "command")
# an image absent on the host: "missing" pulls it as the launch starts, "never" refuses
PULL_POLICIES = ("missing", "never")


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """The server runs in a container of `image`, started by the runtime's CLI on the host
    (the agent stays outside it); how it is built: tui.core.container."""

    image: str
    runtime: str = "docker"
    gpus: str | tuple[int, ...] = "all"  # "all", "none", or device indices
    ipc: str | None = None  # "host": the host's IPC namespace (NCCL's shared memory)
    shm_size: str | None = None  # "16g": /dev/shm's size when ipc is not "host"
    volumes: tuple[str, ...] = ()  # "host:container[:opts]"
    run_args: tuple[str, ...] = ()  # further `docker run` arguments, as written
    entrypoint: str = "image"
    python: str = "python3"  # the image's Python: runs SGLang and the simulated engine
    pull: str = "missing"  # PULL_POLICIES



def _gpus(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list):
        return _list(_bounded(_int, 0))(value)
    if isinstance(value, str) and value in ("all", "none"):
        return value
    raise _Invalid(f"expected \"all\", \"none\" or a list of device indices like [0, 1], "
                   f"got {_describe(value)}")


def _volume(value: Any) -> str:
    parts = _str(value).split(":")
    if not 2 <= len(parts) <= 3 or not all(parts[:2]) or not parts[1].startswith("/"):
        raise _Invalid(f"expected \"host:container[:opts]\" with an absolute container path, "
                       f"got {value!r}")
    return value


_SHM_SIZE = re.compile(r"\d+(?:[bkmg]b?)?", re.I)


def _shm_size(value: Any) -> str:
    if not _SHM_SIZE.fullmatch(_str(value)):
        raise _Invalid(f"expected a size like \"16g\" or \"512m\", got {value!r}")
    return value


def _check_container(values: dict[str, Any]) -> None:
    if values.get("ipc") is not None and values.get("shm_size") is not None:
        raise _Invalid("shm_size has no effect with ipc = \"host\" (the host's /dev/shm is "
                       "used): drop one", ".shm_size")
    for volume in values.get("volumes", ()):
        if _under_run_mount(volume.split(":")[1]):
            raise _Invalid(f"volume {volume!r} mounts over {RUN_MOUNT}, where specconsole "
                           "puts the run's log: mount it elsewhere", ".volumes")
    why = _run_args_conflict(values.get("run_args", ()))
    if why is not None:
        raise _Invalid(why, ".run_args")


RUN_MOUNT = "/run/specconsole"  # where the run's log is, inside the container
# `docker run` words that take a value (`--name X` or `--name=X`) and that specconsole reads
_VALUED = {"--name", "--pid", "--network", "--net", "--entrypoint", "-v", "--volume", "--mount",
           "-e", "--env", "-l", "--label", "--restart", "-p", "--publish"}
# what a word would break, when set at all
_OWNED = {
    "--rm": "the container would be removed as it ends, and its exit code and OOMKilled with it "
            "(specconsole keeps a crashed container until the profile's next launch)",
    "--name": "specconsole names the container after the run (specconsole-<run id>) to find "
              "it again for watch, kill and attach",
    "--entrypoint": "specconsole's wrapper is the entrypoint (it sends the output to the run's "
                    "log): set container.entrypoint = \"command\" and [server] instead",
    "--pid": "the container must have its own process namespace: specconsole pairs the pids "
             "the log prints with the host's through it",
}


def _run_words(words: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """(flag, its value or None) for each flag of `docker run` words as written."""
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=")
        if flag in _VALUED and not eq:
            value, i = (words[i + 1] if i + 1 < len(words) else ""), i + 1
        yield (flag, value if (eq or flag in _VALUED) else None)
        i += 1


def _under_run_mount(path: str) -> bool:
    """A mount at the run's mount point or inside it (one on a parent is laid first and the
    log's file mount over it, so it is no conflict)."""
    path = path.rstrip("/")
    return path == RUN_MOUNT or path.startswith(RUN_MOUNT + "/")


def _mount_targets(flag: str, value: str) -> list[str]:
    """Where `-v host:target[:opts]` or `--mount type=...,target=...` mounts, in the container."""
    if flag in ("-v", "--volume"):
        return value.split(":")[1:2]
    if flag == "--mount":
        return [v for k, _, v in (p.partition("=") for p in value.split(","))
                if k in ("target", "dst", "destination")]
    return []


def _run_args_conflict(words: Sequence[str]) -> str | None:
    """Why a word of run_args breaks what specconsole sets, in words (None when none does)."""
    for flag, value in _run_words(words):
        why = _OWNED.get(flag)
        if flag == "--restart" and value not in ("no", None):
            why = ("a restart policy brings a dead server back behind specconsole's back: its "
                   "death is the run's end (restart it with `r` or `specconsole PROFILE`)")
        elif flag in ("--network", "--net") and value is not None and (
                value == "none" or value.startswith("container:")):
            why = ("the server must be reachable for its health check: use the default "
                   "network, a network of your own or \"host\"")
        elif flag in ("-e", "--env") and value is not None and \
                value.partition("=")[0] == "SPECCONSOLE_RUN_ID":
            why = "specconsole sets SPECCONSOLE_RUN_ID: it finds the run's processes by it"
        elif flag in ("-l", "--label") and value is not None and value.startswith("specconsole."):
            why = "specconsole's own labels (specconsole.*) say which run a container is"
        elif value is not None and any(_under_run_mount(t) for t in _mount_targets(flag, value)):
            why = f"it mounts over {RUN_MOUNT}, where specconsole puts the run's log"
        if why is not None:
            shown = flag if value is None else f"{flag} {value}"
            return f"run_args has {shown!r}, against what specconsole relies on: {why}"
    return None


_CONTAINER = {
    "runtime": _one_of(RUNTIMES), "image": _str, "gpus": _gpus, "ipc": _one_of(("host",)),
    "shm_size": _shm_size, "volumes": _list(_volume), "run_args": _list(_str),
    "entrypoint": _one_of(ENTRYPOINTS), "python": _str, "pull": _one_of(PULL_POLICIES),
}


def _check_beside(values: dict[str, Any]) -> None:
    """What [container] does not combine with yet, said where it is written."""
    if values.get("nodes"):
        raise _Invalid("[container] runs on one host: several [[hosts]] are not "
                       "supported with it yet", ".container")


CONTAINER_TABLE = Table(
    "container", _section(ContainerConfig, _CONTAINER, ("image",), post=_check_container),
    expanded=(("volumes",), ("python",)), beside=_check_beside)
