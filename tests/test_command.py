"""From profile to argv: exact argv, literal shell quoting, secrets and run ids."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tui.core.command import (
    REDACTED,
    build_server_argv,
    host_python,
    known_secrets,
    new_run_id,
    redact,
    resolve_secrets,
    secret_checks,
    secret_flag_values,
    shell_join,
    speculative_config_json,
)
from tui.core.errors import ProfileError
from tui.core.profile import load_profile, loads_profile

PROFILES = Path(__file__).parent.parent / "profiles"
ECHO_ARGV = "import sys,json;print(json.dumps(sys.argv[1:]))"


def profile(server: str = "", extra: str = "", target: str = "gpu-node-07"):
    text = (f'[host]\ntarget = "{target}"\n[server]\nengine = "vllm"\nmodel = "/m/Kimi"\n'
            f"{server}\n{extra}")
    return loads_profile(text, "/p/test.toml")


def test_vllm_argv_of_the_kimi_profile():
    kimi = load_profile(PROFILES / "kimi-k25-eagle3.toml")
    argv = build_server_argv(kimi, "/unused/python")
    spec = argv[argv.index("--speculative-config") + 1]
    assert argv == [
        "/opt/venvs/vllm/bin/vllm", "serve", "/models/moonshotai/Kimi-K2.5",
        "--port", "8000", "--host", "0.0.0.0", "--tensor-parallel-size", "8",
        "--speculative-config", spec, "--trust-remote-code",
        "--served-model-name", "kimi-k2.5", "--max-model-len", "131072",
        "--gpu-memory-utilization", "0.92"]
    assert json.loads(spec) == {"method": "eagle3", "num_speculative_tokens": 5,
                                "model": "/models/lightseekorg/kimi-k2.5-eagle3"}


def test_speculative_json_keeps_pass_through_keys():
    p = profile(extra='[server.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 3\n'
                      'prompt_lookup_max = 4\nnested = { a = [1, 2], b = "x" }\n')
    assert json.loads(speculative_config_json(p)) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
        "nested": {"a": [1, 2], "b": "x"}}


def test_no_speculative_table_no_flag():
    p = profile('port = 9000\nlisten = "127.0.0.1"\nargs = ["--enforce-eager"]')
    assert speculative_config_json(p) is None
    assert build_server_argv(p, "py") == [
        "vllm", "serve", "/m/Kimi", "--port", "9000", "--host", "127.0.0.1",
        "--tensor-parallel-size", "1", "--enforce-eager"]


def test_command_is_the_escape_hatch():
    p = profile('command = ["/bin/serve.sh", "--x", "1"]\nargs = ["ignored"]',
                '[server.speculative]\nmethod = "ngram"\n')
    assert build_server_argv(p, "py") == ["/bin/serve.sh", "--x", "1"]


def test_simulate_argv():
    p = profile('tensor_parallel_size = 4\nport = 8123\nargs = ["--max-model-len", "4096"]',
                '[server.speculative]\nmethod = "eagle3"\nmodel = "/d"\n'
                '[simulate]\nscenario = "oom"\ntime_scale = 75\ngpus = 4\n')
    assert build_server_argv(p, "/venv/bin/python") == [
        "/venv/bin/python", "-m", "tui.sim.engine", "serve", "/m/Kimi", "--port", "8123",
        "--tensor-parallel-size", "4", "--host", "0.0.0.0",
        "--speculative-config", '{"method": "eagle3", "model": "/d"}',
        "--max-model-len", "4096", "--sim-scenario", "oom", "--sim-time-scale", "75.0",
        "--sim-gpus", "4"]
    with_state = profile(extra='[simulate]\ngpu_state = "/tmp/g s"\n')
    assert build_server_argv(with_state, "py")[-2:] == ["--sim-gpu-state", "/tmp/g s"]


def test_host_python():
    assert host_python(profile(target="local")) == sys.executable
    assert host_python(profile()) == "python3"
    assert host_python(load_profile(PROFILES / "kimi-k25-eagle3.toml")) == (
        "/opt/venvs/vllm/bin/python")


def test_shell_metacharacters_reach_the_server_as_literal_text(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}",
        f"; rm -rf ~ ; touch {marker}",
        f"' ; touch {marker} ; '", f'" ; touch {marker} ; "', f"a\ntouch {marker}\n",
        f"&& touch {marker} || touch {marker} | cat > {marker}", "$HOME ${PATH} * ~ \\ !!", "",
    ]
    server = (f"executable = {json.dumps([sys.executable, '-c', ECHO_ARGV])}\n"
              f"args = {json.dumps(payloads)}\n"
              f"listen = {json.dumps(payloads[0])}")
    p = profile(server, '[server.speculative]\nmethod = "ngram"\nodd = "\'$(x)\\"; ls"\n')
    argv = build_server_argv(p, "unused")
    result = subprocess.run(["sh", "-c", shell_join(argv)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=30, check=True)
    assert json.loads(result.stdout) == argv[3:]
    assert payloads[0] in argv and payloads[-1] in argv
    assert not marker.exists()
    # The same payload unquoted does run: the check above can fail.
    subprocess.run(["sh", "-c", f"true {payloads[0]}"], cwd=tmp_path, timeout=30, check=True)
    assert marker.exists()


def test_resolve_secrets():
    p = profile('secret_env = ["HF_TOKEN", "WANDB_KEY"]')
    assert resolve_secrets(p, {"HF_TOKEN": "hf_abc", "WANDB_KEY": "w123", "X": "y"}) == {
        "HF_TOKEN": "hf_abc", "WANDB_KEY": "w123"}
    assert resolve_secrets(profile(), {}) == {}


@pytest.mark.parametrize("environ", [{"HF_TOKEN": "hf_abc"},
                                     {"HF_TOKEN": "hf_abc", "WANDB_KEY": ""}])
def test_missing_secret_names_the_variable_and_the_profile(environ):
    p = profile('secret_env = ["HF_TOKEN", "WANDB_KEY"]')
    with pytest.raises(ProfileError) as caught:
        resolve_secrets(p, environ)
    message = str(caught.value)
    assert "WANDB_KEY" in message and "/p/test.toml" in message and "server.secret_env" in message
    assert "hf_abc" not in message and "\n" not in message


@pytest.mark.parametrize(("text", "secrets", "expected"), [
    ("token=hf_abcdef in argv", ["hf_abcdef"], f"token={REDACTED} in argv"),
    ("a hf_abcdef b hf_abcdef", ["hf_abcdef"], f"a {REDACTED} b {REDACTED}"),
    ("pw abc stays, abcd goes", ["abc", "abcd"], f"pw abc stays, {REDACTED} goes"),
    ("long secret_longer", ["secret", "secret_longer"], f"long {REDACTED}"),
    ("nothing here", [], "nothing here"),
    ("empty value", [""], "empty value"),
])
def test_redact(text, secrets, expected):
    assert redact(text, secrets) == expected


@pytest.mark.parametrize(("argv", "expected"), [
    (["--api-key", "k1", "--port", "8000"], ["k1"]),
    (["--api-key", "k1", "k2", "--max-model-len", "4096"], ["k1", "k2"]),  # vLLM: one or more
    (["--api-key=k1=tail", "--hf-token", "hf_x"], ["k1=tail", "hf_x"]),
    (["--hf-token", "--trust-remote-code"], []),  # alone: the cached login, no value here
    (["--admin-api-key", "a", "--ssl-keyfile-password=p", "--ssl-keyfile", "/k.pem"],
     ["a", "p"]),
    (["--api-keys", "x", "--served-model-name", "key"], []),  # only the flags themselves
])
def test_secret_flag_values(argv, expected):
    assert secret_flag_values(argv) == expected


def test_known_secrets_are_every_value_that_must_not_be_shown():
    text = ('args = ["--api-key", "s3cr3t-arg"]\nsecret_env = ["WANDB_KEY"]\n'
            'command = ["sh", "-c", "x", "--hf-token=hf_incommand"]\n'
            '[server.env]\nHF_TOKEN = "${HF}"\nCACHE = "${HOME}/hf"\nLIT_PASSWORD = "pw-literal"\n'
            'TOKENIZERS_PARALLELISM = "false"\nN = "${N:-${DEFAULT_N:-n-default}}"\n'
            'MASTER_PORT = "${PORT}"\nOFFLINE = "${OFF}"')
    p = loads_profile(f'[host]\ntarget = "h"\n[server]\nengine = "vllm"\nmodel = "/m"\n{text}',
                      "/p/t.toml", {"HF": "hf_fromshell", "HOME": "/home/u", "DEFAULT_N": "n-env",
                                    "PORT": "29500", "OFF": "True"})
    # a path, a number or a switch from the shell is no secret; "false" and a literal default
    # are no secrets either
    assert set(known_secrets(p, {"WANDB_KEY": "w-value"})) == {
        "w-value", "hf_fromshell", "n-env", "pw-literal", "hf_incommand", "s3cr3t-arg"}
    assert known_secrets(profile(), {}) == ()


@pytest.mark.parametrize(("engine", "server", "says"), [
    ("vllm", 'args = ["--api-key", "k"]', 'secret_env = ["VLLM_API_KEY"]'),
    ("vllm", 'args = ["--hf-token=k"]', 'secret_env = ["HF_TOKEN"]'),
    ("sglang", 'args = ["--api-key", "k"]', "sglang takes it only as an argument: put it in the "
                                           "YAML file that `--config` names"),
    ("vllm", 'env = {HF_TOKEN = "x"}', 'server.env.HF_TOKEN looks like a secret'),
])
def test_check_warns_of_a_secret_where_it_leaks(engine, server, says):
    p = loads_profile(f'[host]\ntarget = "h"\n[server]\nengine = "{engine}"\nmodel = "/m"\n'
                      f"{server}", "/p/t.toml", {})
    (check,) = secret_checks(p)
    assert (check.check, check.ok, check.severity) == ("secrets", False, "warning")
    assert says in check.message and "\n" not in check.message and "k" not in check.message.split()


def test_no_secret_no_warning():
    assert secret_checks(profile('secret_env = ["HF_TOKEN"]\nenv = {TOKENIZERS_PARALLELISM = '
                                 '"false"}')) == ()


def test_new_run_id():
    now = datetime(2025, 3, 4, 5, 6, 7)
    run_id = new_run_id("kimi-k25-eagle3", now)
    assert re.fullmatch(r"kimi-k25-eagle3-20250304-050607-[0-9a-f]{6}", run_id)
    assert new_run_id("kimi-k25-eagle3", now) != run_id
    assert re.fullmatch(r"my_pro_file_x.y-\d{8}-\d{6}-[0-9a-f]{6}",
                        new_run_id("my pro/file;x.y", now.timestamp()))
    assert new_run_id("../..", now).startswith("_..-20250304-")
    assert new_run_id("", now).startswith("run-")
