"""[container] profiles and the docker/podman argv built from them (pure), the agent's side of
it (run argv, NSpid), and the core naming a containerised process by both its pids."""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path

import pytest

from tui.agent.container import Box, remove_ended, run_argv, write_secrets
from tui.agent.names import vllm_name
from tui.agent.procfs import read_nspid
from tui.agent.wire import AgentFailure
from tui.core.container import container_spec, gpu_args, run_options
from tui.core.describe import death_lines
from tui.core.errors import ProfileError
from tui.core.profile import ContainerConfig, load_profile, loads_profile
from tui.core.protocol import ProcExit, ProcInfo, Procs, RunExit
from tui.core.state import Died, LaunchMachine
from tui.remote.launcher import plan_launch

BASE = """[host]
target = "local"
[server]
engine = "vllm"
model = "/models/Kimi-K2.5"
port = 8000
tensor_parallel_size = 8
secret_env = ["HF_TOKEN"]
"""


def _profile(container: str, extra: str = ""):
    return loads_profile(BASE + extra + "[container]\n" + container, "p.toml")


@pytest.mark.parametrize(("table", "message"), [
    ('image = "x"\nimgae = "y"\n',
     "p.toml:11: container.imgae: unknown key 'imgae' (did you mean 'image'?)"),
    ('runtime = "podmn"\nimage = "x"\n',
     "container.runtime: unknown value 'podmn' (did you mean 'podman'?)"),
    ('runtime = "docker"\n', "container.image: missing required key 'image'"),
    ('image = "x"\ngpus = "some"\n', 'container.gpus: expected "all", "none" or a list'),
    ('image = "x"\ngpus = [0, -1]\n', "container.gpus[1]: must be >= 0"),
    ('image = "x"\nvolumes = ["/models"]\n', "container.volumes[0]: expected \"host:container"),
    ('image = "x"\nshm_size = "lots"\n', "container.shm_size: expected a size"),
    ('image = "x"\nipc = "host"\nshm_size = "16g"\n', "container.shm_size: shm_size has no effect"),
    ('image = "x"\nentrypoint = "cmd"\n', "did you mean 'command'?"),
    ('image = "x"\nrun_args = ["--rm"]\n', "p.toml:11: container.run_args: run_args has '--rm'"),
    ('image = "x"\nrun_args = ["--name", "mine"]\n', "run_args has '--name mine'"),
    ('image = "x"\nrun_args = ["--pid=host"]\n', "run_args has '--pid host'"),
    ('image = "x"\nrun_args = ["--network", "none"]\n', "run_args has '--network none'"),
    ('image = "x"\nrun_args = ["--entrypoint", "bash"]\n', "run_args has '--entrypoint bash'"),
    ('image = "x"\nrun_args = ["--restart=always"]\n', "run_args has '--restart always'"),
    ('image = "x"\nrun_args = ["-e", "SPECCONSOLE_RUN_ID=x"]\n', "'-e SPECCONSOLE_RUN_ID=x'"),
    ('image = "x"\nrun_args = ["--label", "specconsole.run_id=y"]\n', "specconsole's own labels"),
    ('image = "x"\nrun_args = ["-v", "/tmp:/run/specconsole"]\n', "mounts over /run/specconsole"),
    ('image = "x"\nrun_args = ["--mount", "type=bind,src=/t,dst=/run/specconsole/x"]\n',
     "mounts over /run/specconsole"),
    ('image = "x"\nvolumes = ["/tmp:/run/specconsole"]\n', "container.volumes: volume '/tmp:"),
])
def test_a_bad_container_table_is_one_line(table: str, message: str) -> None:
    with pytest.raises(ProfileError) as err:
        _profile(table)
    text = str(err.value)
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize(("runtime", "gpus", "expected"), [
    ("docker", "all", ["--gpus", "all"]),
    ("docker", (0, 1), ["--gpus", '"device=0,1"']),
    ("docker", "none", []),
    ("podman", "all", ["--device", "nvidia.com/gpu=all"]),
    ("podman", (0, 3), ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=3"]),
])
def test_gpus_in_each_runtime(runtime: str, gpus, expected: list[str]) -> None:
    assert gpu_args(ContainerConfig(image="x", runtime=runtime, gpus=gpus)) == expected


def test_run_options_name_label_publish_and_pass_env_by_name_only() -> None:
    profile = _profile('image = "vllm/vllm-openai:v0.32.0"\nipc = "host"\n'
                       'volumes = ["/models:/models:ro"]\nrun_args = ["--ulimit", "memlock=-1"]\n')
    opts = run_options(profile, "p-1", ["PYTHONUNBUFFERED", "HF_TOKEN"])
    assert opts[:7] == ["--name", "specconsole-p-1", "--label", "specconsole.run_id=p-1",
                        "--label", "specconsole.profile=p@local", "--init"]
    assert opts[opts.index("HF_TOKEN") - 1:opts.index("HF_TOKEN") + 1] == ["-e", "HF_TOKEN"]
    assert "SPECCONSOLE_RUN_ID" in opts and not any("=" in w and "TOKEN" in w for w in opts)
    assert opts[-2:] == ["--ulimit", "memlock=-1"]
    for pair in (["-p", "8000:8000"], ["--gpus", "all"], ["--ipc", "host"],
                 ["-v", "/models:/models:ro"]):
        at = opts.index(pair[0])
        assert opts[at:at + 2] == pair
    host_net = _profile('image = "x"\nrun_args = ["--network", "host"]\n')
    assert "-p" not in run_options(host_net, "p-1", [])
    assert run_options(profile, "p-1", ["HF_TOKEN", "A"], ["HF_TOKEN"]).count("-e") == 2


@pytest.mark.parametrize(("listen", "publish"), [
    ("127.0.0.1", "127.0.0.1:8000:8000"), ("localhost", "127.0.0.1:8000:8000"),
    ("::1", "[::1]:8000:8000"), ("10.1.2.3", "10.1.2.3:8000:8000"), ("0.0.0.0", "8000:8000"),
    ("::", "8000:8000"),
])
def test_the_port_is_published_at_listen_and_the_server_listens_on_the_containers_all(
        listen: str, publish: str) -> None:
    profile = _profile('image = "vllm/vllm-openai"\nentrypoint = "command"\n',
                       extra=f'listen = "{listen}"\n')
    plan = plan_launch(profile, {"HF_TOKEN": "t" * 8}, now=0.0)
    assert plan.container is not None
    options = plan.container["options"]
    assert options[options.index("-p") + 1] == publish
    assert plan.argv[plan.argv.index("--host") + 1] == "0.0.0.0"
    on_host = _profile('image = "x"\nentrypoint = "command"\nrun_args = ["--network=host"]\n',
                       extra=f'listen = "{listen}"\n')
    argv = plan_launch(on_host, {"HF_TOKEN": "t" * 8}, now=0.0).argv
    assert argv[argv.index("--host") + 1] == listen  # the host's own network: as written


def test_the_image_entrypoint_gets_the_servers_arguments_and_no_secret_value() -> None:
    profile = _profile('image = "vllm/vllm-openai"\n')
    plan = plan_launch(profile, {"HF_TOKEN": "hf_secret_value"}, now=0.0)
    spec = plan.container
    assert spec is not None and spec["entrypoint"] == "image"
    assert spec["command"][:3] == ["/models/Kimi-K2.5", "--port", "8000"]  # no `vllm serve`
    assert "hf_secret_value" not in repr(spec) and plan.env["HF_TOKEN"] == "hf_secret_value"
    assert spec["secret_env"] == ["HF_TOKEN"] and "HF_TOKEN" not in spec["options"]
    inner = ["vllm", "serve", *spec["command"]]
    argv = run_argv(Box(spec), "/runs/r 1", inner, secrets=True)
    assert argv[:3] == ["docker", "run", "-d"]
    at = argv.index("--entrypoint")
    assert argv[at - 4:at] == ["-v", "/runs/r 1/server.log:/run/specconsole/server.log",
                               "-v", "/runs/r 1/secrets.env:/run/specconsole/secrets.env"]
    assert argv[at - 6] == "--label" and argv[at - 5].startswith("specconsole.user=")
    assert argv[at:at + 4] == ["--entrypoint", "sh", "vllm/vllm-openai", "-c"]
    script = argv[at + 4]
    assert script.startswith("exec >>/run/specconsole/server.log 2>&1; ")
    assert ". /run/specconsole/secrets.env; set +a; : >/run/specconsole/secrets.env; " in script
    assert script.endswith('exec "$@"') and argv[at + 5] == "sh" and argv[at + 6:] == inner
    assert "-v" not in argv[at:] and not any(w.startswith("/runs/r 1:") for w in argv)
    plain = run_argv(Box(spec), "/runs/r 1", inner, secrets=False)
    assert "secrets.env" not in " ".join(plain)


def test_the_secrets_file_gives_the_wrapper_each_value_exactly(tmp_path: Path) -> None:
    """The file the wrapper sources (by a real sh) sets each secret to its value, however it
    is quoted, and nothing else; the file is the owner's alone."""
    values = {"HF_TOKEN": "hf_'quoted' $HOME `x` \\ \"q\" ; rm -rf /", "OTHER": "plain"}
    path = tmp_path / "secrets.env"
    assert write_secrets(str(path), values, ["HF_TOKEN", "MISSING"])
    assert path.stat().st_mode & 0o777 == 0o600
    done = subprocess.run(["sh", "-c", f'set -a; . {path}; printf %s "$HF_TOKEN"; '
                           'printf "|%s" "${OTHER-unset}"'], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]}, check=True)
    assert done.stdout == values["HF_TOKEN"] + "|unset"
    assert not write_secrets(str(tmp_path / "none.env"), values, ["MISSING"])
    assert not (tmp_path / "none.env").exists()


def test_the_command_entrypoint_runs_the_built_server_command_with_the_image_python() -> None:
    profile = loads_profile(BASE.replace('"vllm"', '"sglang"') +
                            '[container]\nimage = "lmsysorg/sglang"\nentrypoint = "command"\n',
                            "s.toml")
    spec = container_spec(profile, "s-1", plan_launch(profile, {"HF_TOKEN": "x" * 8}).argv,
                          {})
    assert spec["command"][:3] == ["python3", "-m", "sglang.launch_server"]


# podman 4 refuses the whole `ps` for a status it does not know ("dead": exit 125)
FAKE_PODMAN = """#!/bin/sh
echo "$@" >> "$0.calls"
case "$*" in *status=dead*) echo 'Error: unknown container state: dead' >&2; exit 125;; esac
case "$1" in ps) echo c0ffee;; esac
"""


def _box(runtime: str) -> Box:
    return Box({"runtime": runtime, "name": "specconsole-r", "image": "i", "options": [],
                "command": [], "profile_label": "specconsole.profile=p"})


def test_the_profiles_ended_containers_are_found_with_the_statuses_each_runtime_knows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "podman"
    fake.write_text(FAKE_PODMAN)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert remove_ended(_box("podman")) == ["c0ffee"]
    calls = (tmp_path / "podman.calls").read_text().splitlines()
    assert "label=specconsole.profile=p" in calls[0] and "status=stopped" in calls[0]
    assert f"label=specconsole.user={getpass.getuser()}" in calls[0]  # never another's
    assert calls[1] == "rm c0ffee"
    (tmp_path / "docker").write_text(FAKE_PODMAN)  # refuses "dead" as podman would
    (tmp_path / "docker").chmod(0o755)
    with pytest.raises(AgentFailure, match=r"^`docker ps` cannot list the profile's ended "
                                           r"containers: Error: unknown container state: dead$"):
        remove_ended(_box("docker"))


@pytest.mark.parametrize(("init", "comm"), [("/sbin/docker-init", "docker-init"),
                                           ("/run/podman-init", "podman-init")])
def test_a_containers_init_is_named_by_itself_never_as_the_server(init: str, comm: str) -> None:
    argv = [init, "--", "sh", "-c", 'exec "$@" >>/run/specconsole/server.log 2>&1', "sh",
            "vllm", "serve", "/models/m"]
    assert vllm_name(argv, comm, top=True) == comm


def test_nspid_is_none_for_a_host_process() -> None:
    assert read_nspid(os.getpid()) is None
    assert read_nspid(2**22 + 1) is None  # no such process


T0 = 1000.0


def test_a_worker_in_a_container_is_named_from_the_log_by_its_container_pid() -> None:
    m = LaunchMachine(engine="vllm")
    m.started(4300, T0, T0)
    m.feed_procs(Procs(T0 + 1, (ProcInfo(4312, 4301, "VLLM::Worker_TP", "VLLM::Worker_TP3",
                                         "running", 0.0, 0, T0, True, cpid=11),)))
    m.feed_lines([(0, "(Worker_TP3 pid=11) INFO 12-06 03:54:01 loading")], T0 + 2)
    assert m.names()[4312] == "Worker_TP3"
    events = m.feed_exit(ProcExit(4312, "VLLM::Worker_TP", None, 9, T0 + 3, False, 11), T0 + 3)
    death = next(e for e in events if isinstance(e, Died)).death
    assert death.summary().startswith("Worker_TP3 (pid 4312, 11 in the container) died, "
                                      "signal 9")
    after = m.feed_run_exit(RunExit(4300, 137, None, T0 + 4, oom_killed=True,
                                    container="specconsole-r"), T0 + 4)
    assert after and m.death is not None and m.death.oom_killed
    assert "killed by the container's memory limit (OOMKilled)" in m.death.summary()
    assert any("OOMKilled" in line for line in death_lines(m.death)[1:2])


def test_the_example_container_profiles_load() -> None:
    root = Path(__file__).resolve().parent.parent / "profiles"
    for name in ("kimi-k25-eagle3-docker.toml", "sglang-docker.toml"):
        profile = load_profile(root / name, environ={"HOME": "/home/me"})
        assert profile.container is not None
