"""Profiles: every mistake is one line naming the file, the line and the key path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tui.core.errors import ProfileError
from tui.core.profile import (
    ExpectConfig,
    PreflightConfig,
    Profile,
    expand_vars,
    load_profile,
    loads_profile,
    parse_duration,
)

PROFILES = sorted((Path(__file__).parent.parent / "profiles").glob("*.toml"))

HOST = '[host]\ntarget = "gpu-node-07"\n'
SERVER = '[server]\nengine = "vllm"\nmodel = "/models/m"\n'
BASE = HOST + "\n" + SERVER


# (id, profile text, key path, the text on the offending line or None, fragment of the message)
BAD = [
    ("toml-syntax", BASE + "port = = 8000\n", "", "port = = 8000", "TOML syntax error"),
    ("unknown-key", BASE + "tensor_paralel_size = 8\n", "server.tensor_paralel_size",
     "tensor_paralel_size", "did you mean 'tensor_parallel_size'?"),
    ("unknown-key-no-match", BASE + "zzz = 1\n", "server.zzz", "zzz", "valid keys: engine"),
    ("unknown-table", BASE + '[serverr]\nport = 1\n', "serverr", "[serverr]",
     "unknown table 'serverr' (did you mean 'server'?)"),
    ("wrong-type", BASE + 'port = "8000"\n', "server.port", 'port = "8000"',
     "expected an integer, got a string ('8000')"),
    ("bool-for-int", BASE + "tensor_parallel_size = true\n", "server.tensor_parallel_size",
     "tensor_parallel_size = true", "expected an integer, got a boolean (true)"),
    ("bool-for-float", HOST + "connect_timeout = false\n\n" + SERVER, "host.connect_timeout",
     "connect_timeout", "got a boolean (false)"),
    ("int-for-bool", BASE + "[preflight]\ncompile = 1\n", "preflight.compile", "compile = 1",
     "expected a boolean"),
    ("missing-model", HOST + '[server]\nengine = "vllm"\n', "server.model", "[server]",
     "missing required key 'model'"),
    ("missing-engine", HOST + '[server]\nmodel = "m"\n', "server.engine", "[server]",
     "missing required key 'engine'"),
    ("missing-target", '[host]\njump = "j"\n' + SERVER, "host.target", "[host]",
     "missing required key 'target'"),
    ("missing-host", SERVER, "host", None,
     "missing required table 'host' (or [[hosts]] for several)"),
    ("unknown-engine", HOST + '[server]\nengine = "vlm"\nmodel = "m"\n', "server.engine",
     'engine = "vlm"', "did you mean 'vllm'?"),
    ("port-zero", BASE + "port = 0\n", "server.port", "port = 0", "between 1 and 65535"),
    ("port-too-big", BASE + "port = 65536\n", "server.port", "port = 65536",
     "between 1 and 65535, got 65536"),
    ("tp-zero", BASE + "tensor_parallel_size = 0\n", "server.tensor_parallel_size",
     "tensor_parallel_size = 0", "must be >= 1, got 0"),
    ("tp-negative", BASE + "tensor_parallel_size = -2\n", "server.tensor_parallel_size",
     "tensor_parallel_size = -2", "must be >= 1, got -2"),
    ("args-item-type", BASE + 'args = ["--a", 3]\n', "server.args[1]", "args = ",
     "expected a string, got an integer (3)"),
    ("env-value-type", BASE + "env = { A = 1 }\n", "server.env.A", "env = ", "expected a string"),
    ("secret-env-name", BASE + 'secret_env = ["HF TOKEN"]\n', "server.secret_env[0]",
     "secret_env", "not an environment variable name"),
    ("empty-command", BASE + "command = []\n", "server.command", "command = []",
     "must not be empty"),
    ("spec-unknown-method", BASE + '[server.speculative]\nmethod = "eagel3"\nmodel = "d"\n',
     "server.speculative.method", 'method = "eagel3"', "did you mean 'eagle3'?"),
    ("spec-eagle3-no-drafter", BASE + '[server.speculative]\nmethod = "eagle3"\n',
     "server.speculative.model", "[server.speculative]", "needs the drafter's `model`"),
    ("spec-tokens-zero",
     BASE + '[server.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 0\n',
     "server.speculative.num_speculative_tokens", "num_speculative_tokens = 0", "must be >= 1"),
    ("spec-inline-table", BASE + 'speculative = { method = "eagle" }\n',
     "server.speculative.model", "speculative = {", "needs the drafter's `model`"),
    ("spec-passthrough-date", BASE + '[server.speculative]\nmethod = "ngram"\nwhen = 1979-05-27\n',
     "server.speculative.when", "when = 1979", "cannot be passed to the engine as JSON"),
    ("sglang-vllm-method", BASE.replace('"vllm"', '"sglang"') +
     '[server.speculative]\nmethod = "ngram"\n', "server.speculative.method", 'method = "ngram"',
     "method 'ngram' is vLLM's; with engine = \"sglang\" use one of: eagle3, eagle"),
    ("sglang-vllm-tokens", BASE.replace('"vllm"', '"sglang"') + '[server.speculative]\n'
     'method = "eagle3"\nmodel = "d"\nnum_speculative_tokens = 5\n',
     "server.speculative.num_speculative_tokens", "num_speculative_tokens = 5",
     "num_speculative_tokens is vLLM's"),
    ("vllm-sglang-key", BASE + '[server.speculative]\nmethod = "eagle3"\nmodel = "d"\n'
     "num_draft_tokens = 4\n", "server.speculative.num_draft_tokens", "num_draft_tokens = 4",
     "num_draft_tokens is SGLang's (--speculative-num-draft-tokens)"),
    ("bad-duration", BASE + '[expect]\nload_time = "25 minutes"\n', "expect.load_time",
     "load_time", "invalid duration '25 minutes'"),
    ("zero-duration", BASE + '[expect]\nstall_timeout = "0s"\n', "expect.stall_timeout",
     "stall_timeout", "must be > 0"),
    ("negative-duration", BASE + "[expect]\nready_timeout = -5\n", "expect.ready_timeout",
     "ready_timeout", "must be > 0"),
    ("on-ready-timeout", BASE + '[expect]\nready_timeout = "40m"\non_ready_timeout = "stop"\n',
     "expect.on_ready_timeout", "on_ready_timeout", "unknown value 'stop'; expected one of: "
     "keep, kill"),
    ("bad-regex", BASE + '[logs]\nhide = [\n  { pattern = "a" },\n  "b",\n'
     '  { pattern = "(unclosed", label = "x" },\n]\n', "logs.hide[2].pattern", "(unclosed",
     "invalid regex '(unclosed'"),
    ("bad-regex-bare", BASE + '[logs]\nharmless = ["ok", "[z-a]"]\n', "logs.harmless[1]",
     "harmless = ", "invalid regex '[z-a]'"),
    ("rule-unknown-key", BASE + "[[logs.hide]]\npattern = 'a'\n[[logs.hide]]\npatern = 'b'\n",
     "logs.hide[1].patern", "patern", "did you mean 'pattern'?"),
    ("sim-scenario", BASE + '[simulate]\nscenario = "syntax_error"\n', "simulate.scenario",
     "scenario", "did you mean 'syntax-error'?"),
    ("sim-time-scale", BASE + "[simulate]\ntime_scale = 0\n", "simulate.time_scale",
     "time_scale", "must be > 0"),
    ("nan-float", BASE + "[simulate]\ntime_scale = nan\n", "simulate.time_scale",
     "time_scale", "expected a finite number, got nan"),
    ("section-not-table", BASE + "logs = 3\n", "server.logs", "logs = 3", "unknown key 'logs'"),
    ("control-char-key", HOST + '"a\\nb" = 1\n' + SERVER, "host.a\\nb", "[host]",
     "unknown key 'a\\nb'"),
    ("top-level-not-table", 'expect = "25m"\n' + BASE, "expect", 'expect = "25m"',
     "expected a table, got a string"),
]


@pytest.mark.parametrize(("text", "key", "marker", "fragment"),
                         [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_profile_is_one_line_naming_file_line_and_key(tmp_path, text, key, marker,
                                                           fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    error = caught.value
    message = str(error)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert fragment in message
    assert error.key == key
    if key:
        assert f": {key}: " in message
    if marker is None:
        assert error.line is None
    else:
        line = next(n for n, t in enumerate(text.splitlines(), 1) if marker in t)
        assert error.line == line
        assert message.startswith(f"{path}:{line}")


def test_toml_syntax_error_gives_line_and_column():
    with pytest.raises(ProfileError) as caught:
        loads_profile('[host]\ntarget = "x"\n[server]\nport = = 8000\n', "p/bad.toml")
    assert (caught.value.line, caught.value.column) == (4, 8)
    assert str(caught.value).startswith("p/bad.toml:4:8: TOML syntax error: Invalid value")


def test_toml_error_at_end_of_document_still_has_a_line():
    with pytest.raises(ProfileError) as caught:
        loads_profile('[host]\ntarget = "x"\nargs = [1,', "bad.toml")
    assert caught.value.line == 3
    assert "\n" not in str(caught.value)


def test_unreadable_file_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "missing.toml")


@pytest.mark.parametrize("path", PROFILES, ids=[p.name for p in PROFILES])
def test_shipped_profiles_load(path):
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.server.model


def test_shipped_profiles_are_the_agreed_ones():
    assert {p.stem for p in PROFILES} >= {"kimi-k25-eagle3", "demo", "demo-crash"}
    kimi = load_profile(PROFILES[0].parent / "kimi-k25-eagle3.toml")
    assert kimi.server.tensor_parallel_size == 8
    assert kimi.server.speculative.method == "eagle3"
    assert kimi.server.speculative.num_speculative_tokens == 5
    assert kimi.expect.load_time == 25 * 60
    assert kimi.expect.stall_timeout == 10 * 60
    harmless = kimi.logs.harmless[0].pattern
    assert harmless.search("(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [gpt_oss_triton_kernels"
                           "_moe.py:60] Failed to import Triton kernels. Please make sure your "
                           "triton version is compatible. Error: cannot import name "
                           "'SparseMatrix' from 'triton_kernels.tensor'")
    hidden = [rule.pattern for rule in kimi.logs.hide]
    for line in ("<frozen importlib._bootstrap_external>:1301: FutureWarning: The cuda.cudart "
                 "module is deprecated", "argument '--disable-log-requests' is deprecated"):
        assert any(p.search(line) for p in hidden)
    demo, crash = (load_profile(PROFILES[0].parent / f"{n}.toml") for n in ("demo", "demo-crash"))
    assert demo.host.target == crash.host.target == "local"
    assert demo.simulate.scenario == "ready"
    assert 15 <= 25 * 60 / demo.simulate.time_scale <= 25
    assert crash.simulate.scenario == "syntax-error"
    assert crash.preflight.compile is False


def test_defaults():
    profile = loads_profile(BASE, "/somewhere/my.profile.toml")
    assert isinstance(profile, Profile)
    assert (profile.path, profile.name, profile.key) == (
        "/somewhere/my.profile.toml", "my.profile", "my.profile@gpu-node-07")
    host, server = profile.host, profile.server
    assert (host.jump, host.python, host.workdir, host.known_hosts) == (None,) * 4
    assert (host.runs_dir, host.strict_host_keys) == ("~/.specconsole/runs", True)
    assert (host.keepalive_interval, host.keepalive_count_max, host.connect_timeout) == (5, 3, 15)
    assert (server.port, server.listen, server.tensor_parallel_size) == (8000, "0.0.0.0", 1)
    assert (server.executable, server.args, server.env, server.secret_env) == (
        None, (), {}, ())  # None: the engine's own launcher
    assert server.command is None and server.speculative is None
    assert profile.preflight == PreflightConfig()
    assert profile.preflight.enabled and profile.preflight.compile_files == ()
    assert profile.logs.hide == profile.logs.harmless == ()
    assert profile.expect == ExpectConfig(load_time=1800, stall_timeout=600, ready_timeout=None)
    assert profile.simulate is None


def test_command_makes_model_optional_and_simulate_defaults():
    profile = loads_profile(HOST + '[server]\nengine = "vllm"\ncommand = ["./serve.sh"]\n', "c")
    assert profile.server.command == ("./serve.sh",) and profile.server.model is None
    sim = loads_profile(BASE + "[simulate]\n", "s").simulate
    assert (sim.scenario, sim.time_scale, sim.gpus, sim.gpu_state) == ("ready", 60, 8, None)


def test_simulate_needs_a_model():
    text = HOST + '[server]\nengine = "vllm"\ncommand = ["x"]\n[simulate]\n'
    with pytest.raises(ProfileError, match=r"server\.model"):
        loads_profile(text, "s.toml")


def test_speculative_passes_further_keys_through():
    profile = loads_profile(BASE + '[server.speculative]\nmethod = "ngram"\n'
                            "num_speculative_tokens = 4\nprompt_lookup_max = 5\n"
                            'draft = { tp = 1, names = ["a"] }\n', "p")
    spec = profile.server.speculative
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("ngram", None, 4)
    assert spec.extra == {"prompt_lookup_max": 5, "draft": {"tp": 1, "names": ["a"]}}


def test_log_rules_accept_bare_strings_and_tables():
    logs = loads_profile(BASE + "[logs]\nhide = ['^x\\d', { pattern = 'y' }]\n"
                         "[[logs.harmless]]\npattern = 'z'\nlabel = 'zed'\n", "p").logs
    assert [(r.pattern.pattern, r.label) for r in logs.hide] == [("^x\\d", "^x\\d"), ("y", "y")]
    assert [(r.pattern.pattern, r.label) for r in logs.harmless] == [("z", "zed")]


def test_profile_is_frozen():
    profile = loads_profile(BASE, "p")
    with pytest.raises(AttributeError):
        profile.server.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(("value", "seconds"), [
    ("25m", 1500), ("1h30m", 5400), ("90s", 90), ("1.5h", 5400), ("2h5s", 7205), ("90", 90),
    (" 10 m ", 600), (45, 45), (2.5, 2.5),
])
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "m", "25 minutes", "1h30", "5x", "nan", True, None, [1]])
def test_parse_duration_refuses(value):
    with pytest.raises(ValueError):
        parse_duration(value)


# --- ${NAME} in path-like values (the real-vLLM lane's profile names its venv this way) -------

ENV = {"LANE": "/srv/lane", "EMPTY": "", "HOME": "/home/u"}


@pytest.mark.parametrize(("text", "expanded"), [
    ("${LANE}/venv/bin/python", "/srv/lane/venv/bin/python"),
    ("${UNSET:-/opt/x}/m", "/opt/x/m"),
    ("${EMPTY:-/opt/x}", "/opt/x"),  # as in sh: an empty value takes the default
    ("${LANE:-${HOME}/.cache}", "/srv/lane"),
    ("${UNSET:-${HOME}/.cache/lane}/models", "/home/u/.cache/lane/models"),
    ("$LANE and ~ stay literal", "$LANE and ~ stay literal"),
    ("no references", "no references"),
])
def test_expand_vars(text: str, expanded: str) -> None:
    assert expand_vars(text, ENV) == expanded


@pytest.mark.parametrize(("text", "message"), [
    ("${UNSET}/x", "${UNSET} is not set (export it, or write ${UNSET:-default})"),
    ("${LANE", "bad variable reference"),
    ("${UNSET:-/a", "unclosed variable reference"),
    ("${1X}", "expected ${NAME}"),
])
def test_expand_vars_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        expand_vars(text, ENV)


def test_path_values_are_expanded_and_others_are_not() -> None:
    text = ('[host]\ntarget = "local"\npython = "${LANE}/venv/bin/python"\n'
            'runs_dir = "${LANE}/runs"\n\n[server]\nengine = "vllm"\n'
            'model = "${LANE}/models/m"\nexecutable = ["${LANE}/venv/bin/vllm", "serve"]\n'
            'args = ["--x", "${LANE}"]\nenv = { TMPDIR = "${LANE}/tmp" }\n\n'
            '[server.speculative]\nmethod = "eagle3"\nmodel = "${UNSET:-${LANE}/d}"\n'
            'num_speculative_tokens = 3\n')
    p = loads_profile(text, "lane.toml", ENV)
    assert p.host.python == "/srv/lane/venv/bin/python"
    assert p.host.runs_dir == "/srv/lane/runs"
    assert p.server.model == "/srv/lane/models/m"
    assert p.server.executable == ("/srv/lane/venv/bin/vllm", "serve")
    assert p.server.env == {"TMPDIR": "/srv/lane/tmp"}
    assert p.server.speculative is not None and p.server.speculative.model == "/srv/lane/d"
    assert p.server.args == ("--x", "${LANE}")  # argv text is the user's, literally


def test_an_unset_variable_is_one_line_naming_the_key_and_line() -> None:
    text = '[host]\ntarget = "local"\n\n[server]\nengine = "vllm"\nmodel = "${NOPE}/m"\n'
    with pytest.raises(ProfileError) as info:
        loads_profile(text, "lane.toml", ENV)
    shown = str(info.value)
    assert shown.startswith("lane.toml:6: server.model: ${NOPE} is not set")
    assert "\n" not in shown
