"""The phase "pulling image": a container's image pulled by the agent's monitor before the
container starts, recognised from the runtime's own lines and the monitor's.

The line shapes are docker's and podman's non-terminal output (the monitor pipes the pull, so
docker draws no progress bars: one line per layer status), as users pasted them:
- docker, `<tag>: Pulling from <repo>`, `<id>: Already exists`, `<id>: Pull complete`,
  `Digest: sha256:...`, `Status: Downloaded newer image for ...`:
  https://itplaybook.org/courses/docker-deep-dive/chapter002/pulling-images.html
- docker, `<id>: Pulling fs layer` / `Waiting` / `Downloading [==>  ] 8.65MB/70.72MB` /
  `Pull complete`: https://github.com/docker/for-mac/issues/2083,
  https://github.com/ddev/ddev/issues/7669
- docker's statuses `Pulling from library/redis`, `Already exists`, `Digest: sha256:...`:
  https://github.com/spotify/docker-client/issues/857
- podman, `Trying to pull ...`, `Getting image source signatures`, `Copying blob 67ba0b62e05f
  done   |`, then `Error: writing blob: ...`: https://github.com/warewulf/warewulf-node-images/issues/54
- podman, `Copying blob sha256:...`, `Copying config sha256:...`, `Writing manifest to image
  destination`, `Storing signatures`: https://github.com/podman-container-tools/podman/issues/7963
- podman, `Copying blob 770c4d307a2e skipped: already exists`:
  https://github.com/podman-container-tools/podman/issues/7501
"""

from __future__ import annotations

import pytest

from tui.core.failures import classify
from tui.core.logline import parse_line
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.phases import Phase, PhaseHit, detect_phase
from tui.core.protocol import GpuInfo, Gpus, RunExit
from tui.core.state import Died, LaunchMachine, PhaseChanged, State

IMAGE = "vllm/vllm-openai:v0.32.0"

# (raw line, expected hit)
CASES = [
    ("1.27-alpine: Pulling from library/nginx", PhaseHit(Phase.PULLING)),
    ("v0.32.0: Pulling from vllm/vllm-openai", PhaseHit(Phase.PULLING)),
    ("latest: Pulling from library/ubuntu", PhaseHit(Phase.PULLING)),
    ("9b1d4a0e2233: Already exists", PhaseHit(Phase.PULLING)),
    ("1427991e2f34: Pulling fs layer", PhaseHit(Phase.PULLING)),
    ("3d4498f9e4d9: Waiting", PhaseHit(Phase.PULLING)),
    ("e8e263d89203: Downloading [======>                                            ]   "
     "8.65MB/70.72MB", PhaseHit(Phase.PULLING)),
    ("7b1a6ab2e44d: Verifying Checksum", PhaseHit(Phase.PULLING)),
    ("7b1a6ab2e44d: Download complete", PhaseHit(Phase.PULLING)),
    ("7b1a6ab2e44d: Extracting [==================================================>]  "
     "29.54MB/29.54MB", PhaseHit(Phase.PULLING)),
    ("7ddbc47eeb70: Pull complete", PhaseHit(Phase.PULLING)),
    ("Digest: sha256:990e1f57798f433364379cf2583702d843defb7630d8d1bb12dcdc6ce3d91ddb",
     PhaseHit(Phase.PULLING)),
    ("Status: Downloaded newer image for nginx:1.27-alpine", PhaseHit(Phase.PULLING, 1.0)),
    ("Trying to pull docker.io/library/alpine:latest...", PhaseHit(Phase.PULLING)),
    ("Getting image source signatures", PhaseHit(Phase.PULLING)),
    ("Copying blob 67ba0b62e05f done   |", PhaseHit(Phase.PULLING)),
    ("Copying blob sha256:2e4080f83d5d91e34530c47dad645da74f395b2b3951d0d4062a727806d0efeb",
     PhaseHit(Phase.PULLING)),
    ("Copying blob 770c4d307a2e skipped: already exists  ", PhaseHit(Phase.PULLING)),
    ("Copying config sha256:402ab5d178d7e3e88de2ab8b7f3bca532064a7b0936b44300b95ba8a1e03062c",
     PhaseHit(Phase.PULLING)),
    ("Writing manifest to image destination", PhaseHit(Phase.PULLING)),
    ("Storing signatures", PhaseHit(Phase.PULLING)),
    # the monitor's own lines (tui/agent/container.py Pull)
    (f"specconsole: pulling image {IMAGE} (not on this host): docker pull {IMAGE}",
     PhaseHit(Phase.PULLING)),
    (f"specconsole: pulling image {IMAGE}: 3/12 layers",
     PhaseHit(Phase.PULLING, 0.25, detail="3/12 layers")),
    (f"specconsole: pulling image {IMAGE}: 12/12 layers",
     PhaseHit(Phase.PULLING, 1.0, detail="12/12 layers")),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_pull_lines_are_the_phase_pulling_image(raw: str, expected: PhaseHit,
                                                engine: str) -> None:
    hit = detect_phase(parse_line(raw), engine)
    assert hit is not None and hit.phase is Phase.PULLING
    assert hit.progress == pytest.approx(expected.progress)
    assert hit.detail == expected.detail


@pytest.mark.parametrize("raw", [
    "Downloading shards: 100%|██████████| 4/4",                 # huggingface_hub, not docker
    "a1b2c3: Pull complete",                                    # not a 12-digit layer id
    "(APIServer pid=1) INFO 03-20 02:24:49 [api_server.py:1] Waiting for the engine",
    "Status: 200 OK",
    "Error response from daemon: pull access denied for nosuch/image, repository does not "
    "exist or may require 'docker login': denied: requested access to the resource is denied",
])
def test_lines_that_are_not_a_pull(raw: str) -> None:
    hit = detect_phase(parse_line(raw))
    assert hit is None or hit.phase is not Phase.PULLING


def test_the_monitors_failed_pull_line_is_a_fatal_cause_of_its_own() -> None:
    line = (f"specconsole: cannot pull image {IMAGE}: Error response from daemon: manifest for "
            f"{IMAGE} not found: manifest unknown")
    kind = classify(line)
    assert kind is not None and kind.id == "image_pull" and kind.fatal


T0 = 1_000.0


def _machine() -> LaunchMachine:
    m = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")), stall_timeout_s=30.0)
    m.started(4242, T0, T0)
    return m


PULL = [f"specconsole: pulling image {IMAGE} (not on this host): docker pull {IMAGE}",
        "v0.32.0: Pulling from vllm/vllm-openai",
        "1427991e2f34: Pulling fs layer", "d37470673b78: Pulling fs layer",
        "1427991e2f34: Pull complete", f"specconsole: pulling image {IMAGE}: 1/2 layers"]


def test_the_pull_is_a_timed_phase_with_layer_progress_then_launch_follows() -> None:
    m = _machine()
    events = m.feed_lines(enumerate(PULL), T0 + 2)
    assert [e.phase for e in events if isinstance(e, PhaseChanged)] == [Phase.PULLING]
    assert m.state is State.LOADING
    span = m.timeline.current if m.timeline is not None else None
    assert span is not None and span.phase is Phase.PULLING and span.progress == 0.5
    m.feed_lines(enumerate(["vLLM API server version 0.32.0"], start=10), T0 + 90)
    assert m.timeline is not None
    pull, launch = m.timeline.spans
    assert (pull.phase, launch.phase) == (Phase.PULLING, Phase.LAUNCH)
    assert pull.end is not None and pull.duration(T0 + 100) == pytest.approx(88.0)


def test_a_quiet_pull_is_not_a_stall() -> None:
    """docker prints nothing while one large layer downloads, and no GPU memory moves."""
    m = _machine()
    m.feed_lines(enumerate(PULL), T0 + 1)
    m.feed_gpus(Gpus(T0 + 1, (GpuInfo(0, "H200", 1, 100, 0),)), T0 + 1)
    assert m.tick(T0 + 600) == [] and m.state is State.LOADING


def test_a_failed_pull_is_dead_in_the_phase_pulling_image_with_the_runtimes_line() -> None:
    m = _machine()
    said = (f"specconsole: cannot pull image {IMAGE}: Error response from daemon: "
            "Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io: "
            "no such host")
    m.feed_lines(enumerate([*PULL[:2], said]), T0 + 3)
    events = m.feed_run_exit(RunExit(None, 127, None, T0 + 3.1, container="specconsole-x"),
                             T0 + 3.1)
    death = next(e for e in events if isinstance(e, Died)).death
    assert m.state is State.DEAD and death.phase is Phase.PULLING
    assert death.cause is not None and death.cause.line == said


@pytest.mark.parametrize("said", [
    "specconsole: the docker daemon restarted; the container died with it (exit code 0)",
    "specconsole: `podman wait` failed; the container ended with exit code 137",
    "specconsole: the container specconsole-x was removed before docker could say how it ended",
    "specconsole: the container's monitor failed: ValueError: a bug",
    "specconsole: cannot start the container: docker: Error response from daemon: Conflict.",
])
def test_the_monitors_word_on_the_runtime_is_the_cause_not_the_signal_it_sent(said: str) -> None:
    """The daemon stopping the container sends its processes a signal: the run's cause is the
    monitor's line saying why, a fatal cause of its own, read after the deaths."""
    assert (kind := classify(said)) is not None and kind.id == "container_runtime" and kind.fatal
    m = _machine()
    m.feed_lines(enumerate(["vLLM API server version 0.32.0", said]), T0 + 3)
    events = m.feed_run_exit(RunExit(4242, 0, None, T0 + 3.1, container="specconsole-x"),
                             T0 + 3.1)
    death = next(e for e in events if isinstance(e, Died)).death
    assert death.cause is not None and death.cause.line == said
