"""The words of a [container] profile's preflight checks (pure tables): the runtime's problems
with their fixes, the image, the GPU runtime, podman's lingering, the shm rule, reading
`inspect`, and the leftovers a kill acts on. The real daemon: tests/containers."""

from __future__ import annotations

import json
import os

import pytest

from tui.agent.boxcheck import (
    Containers,
    age_words,
    gpu_runtime_words,
    image_words,
    linger_words,
    parse_inspect,
    parse_started,
    runtime_problem,
)
from tui.core.container import preflight_spec, shm_bytes, shm_check
from tui.core.errors import ProfileError
from tui.core.profile import ContainerConfig, loads_profile
from tui.core.protocol import PROTOCOL_VERSION, BoxLeftover, GpuHolder, decode, leftover_words

BASE = """[host]
target = "gpu-node-07"
[server]
engine = "vllm"
model = "/models/m"
port = 8000
[container]
"""

DOCKER_DENIED = ("permission denied while trying to connect to the Docker daemon socket at "
                 "unix:///var/run/docker.sock: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.50/"
                 "info\": dial unix /var/run/docker.sock: connect: permission denied")
DOCKER_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker " \
              "daemon running?"
PODMAN_SUBUID = ("Error: cannot find UID/GID for user alice: no subuid ranges found for user "
                 "\"alice\" in /etc/subuid - check rootless mode in man pages.")


@pytest.mark.parametrize(("runtime", "output", "expected"), [
    ("docker", DOCKER_DENIED,
     f"permission denied on the docker socket for user alice ({DOCKER_DENIED}): add the user "
     "to the docker group (`sudo usermod -aG docker $USER`), then log in again"),
    ("docker", DOCKER_DOWN + "\n",
     f"the docker daemon does not answer ({DOCKER_DOWN}): start it "
     "(`sudo systemctl start docker`)"),
    ("podman", PODMAN_SUBUID,
     f"rootless podman is not set up for user alice ({PODMAN_SUBUID}): give the user "
     "subordinate ids (`sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 "
     "$USER`), then `podman system migrate`"),
    ("podman", "\nError: something else\nmore\n", "`podman info` failed: Error: something else"),
    ("docker", "", "`docker info` failed: no output"),
])
def test_runtime_problems_are_one_line_with_the_fix(runtime: str, output: str,
                                                    expected: str) -> None:
    assert runtime_problem(runtime, output, "alice") == expected


@pytest.mark.parametrize(("present", "pull", "expected"), [
    (True, "missing", (True, "error", "image vllm/vllm-openai:v1 is on this host")),
    (False, "missing", (False, "warning", "image vllm/vllm-openai:v1 is not on this host: the "
                        "launch pulls it first (`docker pull vllm/vllm-openai:v1`)")),
    (False, "never", (False, "error", "image vllm/vllm-openai:v1 is not on this host and "
                      "container.pull = \"never\": pull it (`docker pull vllm/vllm-openai:v1`) "
                      "or fix the name")),
])
def test_image_words(present: bool, pull: str, expected: tuple[bool, str, str]) -> None:
    assert image_words("docker", "vllm/vllm-openai:v1", present, pull) == expected


@pytest.mark.parametrize(("runtime", "runtimes", "cdi", "hook", "ok", "words"), [
    ("docker", ["runc", "nvidia"], [], None, True, "docker lists the nvidia runtime"),
    ("docker", ["runc"], ["/etc/cdi/nvidia.yaml"], None, True, "CDI specs: /etc/cdi/nvidia.yaml"),
    ("docker", ["runc"], [], "/usr/bin/nvidia-container-runtime-hook", True,
     "nvidia-container-runtime-hook found (/usr/bin/nvidia-container-runtime-hook)"),
    ("docker", ["runc"], [], None, False,
     "GPUs are asked for but docker lists no nvidia runtime and there are no CDI specs in "
     "/etc/cdi or /var/run/cdi: install nvidia-container-toolkit, then `sudo nvidia-ctk runtime "
     "configure --runtime=docker` and restart dockerd"),
    ("podman", [], ["/var/run/cdi/nvidia.json"], None, True,
     "CDI specs: /var/run/cdi/nvidia.json"),
    ("podman", [], [], "/usr/bin/nvidia-container-runtime-hook", False,
     "GPUs are asked for but there are no CDI specs in /etc/cdi or /var/run/cdi: install "
     "nvidia-container-toolkit, then `sudo nvidia-ctk cdi generate "
     "--output=/etc/cdi/nvidia.yaml`"),
])
def test_gpu_runtime_words(runtime: str, runtimes: list[str], cdi: list[str],
                           hook: str | None, ok: bool, words: str) -> None:
    assert gpu_runtime_words(runtime, runtimes, cdi, hook) == (ok, words)


@pytest.mark.parametrize(("output", "ok"), [("Linger=yes\n", True), ("Linger=no\n", False),
                                            ("", False)])
def test_linger_words(output: str, ok: bool) -> None:
    got, words = linger_words(output, "alice")
    assert got is ok
    assert ("loginctl enable-linger $USER" in words) is not ok and "alice" in words


@pytest.mark.parametrize(("seconds", "words"), [
    (5, "less than a minute"), (61, "1 min"), (3 * 3600 + 120, "3 h 2 min"),
    (5 * 86400, "5 days"), (-3, "less than a minute"),
])
def test_age_words(seconds: float, words: str) -> None:
    assert age_words(seconds) == words


@pytest.mark.parametrize(("stamp", "epoch"), [
    ("2024-05-01T10:20:30.123456789Z", 1714558830.0),  # docker: nanoseconds, UTC
    ("2024-05-01T12:20:30.5+02:00", 1714558830.0),  # podman: an offset
    ("0001-01-01T00:00:00Z", None),  # created, never started
    ("", None),
])
def test_parse_started(stamp: str, epoch: float | None) -> None:
    assert parse_started(stamp) == epoch


def test_inspect_is_read_into_running_containers_and_a_pid_named_by_its_ancestor() -> None:
    me = os.getpid()
    text = json.dumps([
        {"Id": "a" * 64, "Name": "/specconsole-r1", "Config": {
            "Image": "vllm/vllm-openai:v1", "Labels": {"specconsole.run_id": "r1"}},
         "State": {"Pid": me, "StartedAt": "2024-05-01T10:20:30Z"},
         "NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8000"}]}}},
        {"Id": "b" * 64, "Name": "other", "Config": {"Image": "redis", "Labels": None},
         "State": {"Pid": 0, "StartedAt": ""},
         "HostConfig": {"PortBindings": {"6379/tcp": [{"HostPort": "6380"}]}}},
        "junk",
    ])
    first, second = parse_inspect(text)
    assert (first.name, first.image, first.pid, first.run_id, first.ports) == \
        ("specconsole-r1", "vllm/vllm-openai:v1", me, "r1", frozenset({8000}))
    assert (second.name, second.pid, second.run_id, second.ports) == \
        ("other", None, None, frozenset({6380}))
    assert first.words(1714558830.0 + 7200) == \
        "container specconsole-r1 (vllm/vllm-openai:v1, up 2 h 0 min)"
    found = Containers([first, second])
    assert found.holding(me) is first  # the main process itself (or any descendant)
    assert found.holding(1) is None
    assert found.publishing(6380) is second and found.publishing(9) is None
    assert parse_inspect("not json") == []


@pytest.mark.parametrize(("table", "ok", "message"), [
    ('ipc = "host"', True, 'ipc = "host": the host\'s /dev/shm is shared'),
    ('shm_size = "16g"', True, "/dev/shm of 16g in the container"),
    ('shm_size = "2048m"', True, "/dev/shm of 2048m in the container"),
    ('run_args = ["--ipc=host"]', True, 'ipc = "host": the host\'s /dev/shm is shared'),
    ('run_args = ["--shm-size", "8g"]', True, "/dev/shm of 8g in the container"),
    ('shm_size = "512m"', False,
     'shm_size = "512m" is under 2 GiB: NCCL\'s `unhandled system error` and bus errors are '
     'likely — set container.ipc = "host" or container.shm_size = "16g"'),
    ('shm_size = "16g"\nrun_args = ["--shm-size=64m"]', False,
     'shm_size = "64m" is under 2 GiB: NCCL\'s `unhandled system error` and bus errors are '
     'likely — set container.ipc = "host" or container.shm_size = "16g"'),
    ("", False,
     'neither ipc = "host" nor shm_size is set: docker\'s /dev/shm is 64 MiB: NCCL\'s '
     '`unhandled system error` and bus errors are likely — set container.ipc = "host" or '
     'container.shm_size = "16g"'),
])
def test_the_shm_rule(table: str, ok: bool, message: str) -> None:
    profile = loads_profile(BASE + 'image = "x"\n' + table + "\n", "p.toml")
    assert profile.container is not None
    check = shm_check(profile.container)
    assert (check.check, check.ok, check.severity, check.message) == \
        ("shm", ok, "warning", message)


@pytest.mark.parametrize(("size", "expected"), [
    ("16g", 16 * 2**30), ("512m", 512 * 2**20), ("64MB", 64 * 2**20), ("1048576", 2**20),
    ("2k", 2048), ("lots", None),
])
def test_shm_bytes(size: str, expected: int | None) -> None:
    assert shm_bytes(size) == expected


def test_preflight_spec_and_the_pull_key() -> None:
    profile = loads_profile(BASE + 'image = "x"\npull = "never"\ngpus = "none"\n', "p.toml")
    assert preflight_spec(profile) == {"runtime": "docker", "image": "x", "pull": "never",
                                       "gpus": False, "over_ssh": True}
    assert ContainerConfig("x").pull == "missing"
    with pytest.raises(ProfileError) as caught:
        loads_profile(BASE + 'image = "x"\npull = "always"\n', "p.toml")
    assert str(caught.value) == ("p.toml:9: container.pull: unknown value 'always'; "
                                 "expected one of: missing, never")


def test_a_preflight_answer_carries_leftover_containers_and_their_words() -> None:
    line = json.dumps({"v": PROTOCOL_VERSION, "t": "preflight", "checks": [
        {"check": "gpus_free", "ok": False, "severity": "error", "message": "m",
         "holders": [{"pid": 7, "gpu": 0, "mem": 1, "name": "w", "run_id": "r1",
                      "start_ticks": 9, "leftover": True, "container": "c" * 64}]},
        {"check": "leftover containers", "ok": False, "severity": "error", "message": "m",
         "containers": [{"runtime": "docker", "id": "c" * 64, "name": "specconsole-r1",
                         "run_id": "r1"}]}]})
    holders, boxes = decode(line).checks
    assert holders.holders[0].container == "c" * 64
    assert boxes.containers == (BoxLeftover("docker", "c" * 64, "specconsole-r1", "r1"),)
    pid = GpuHolder(7, 0, 1, "w", "r1", 9, True)
    assert leftover_words([pid]) == "pids 7"
    assert leftover_words([pid, *boxes.containers]) == "pids 7; container specconsole-r1"
    assert leftover_words([*boxes.containers, *boxes.containers]) == \
        "containers specconsole-r1, specconsole-r1"
