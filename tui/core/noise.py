"""Noise rules: lines to hide, and known errors that are harmless.

`hide` lines never show unless the raw view is on; `harmless` lines show dimmed with their label
and are never taken as a root cause. Filtering is a view: nothing is dropped from the run's log.
Rules match `LogLine.message` (prefix, level, timestamp and source location already removed).
The profile's rules are evaluated before the built-ins, so a profile can override them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tui.core.logline import LogLine

NoiseKind = Literal["hide", "harmless"]
_KINDS = ("hide", "harmless")


@dataclass(frozen=True, slots=True)
class NoiseRule:
    """A rule; `needle` (optional) is a literal the message must contain, checked before the
    regex because most lines match no rule and `in` is far cheaper than a regex search."""

    id: str
    kind: NoiseKind
    pattern: re.Pattern[str]
    label: str
    needle: str = ""

    def matches(self, message: str) -> bool:
        return (not self.needle or self.needle in message) and (
            self.pattern.search(message) is not None)


def rule_from_pattern(id: str, kind: str, pattern: str | re.Pattern[str],
                      label: str) -> NoiseRule:
    """A rule from a profile's `[logs]` entry; raises ValueError (bad kind) or re.error."""
    if kind not in _KINDS:
        raise ValueError(f"noise rule kind must be 'hide' or 'harmless', not {kind!r}")
    compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
    return NoiseRule(id, kind, compiled, label)  # type: ignore[arg-type]


def _rule(id: str, kind: NoiseKind, needle: str, pattern: str, label: str) -> NoiseRule:
    return NoiseRule(id, kind, re.compile(pattern), label, needle)


# Only a blank message can match it, so the filter skips it for all others.
_BLANK_RE = re.compile(r"\A\s*\Z")
_BLANK = NoiseRule("blank", "hide", _BLANK_RE, "blank line (tqdm leftover)")


# Not an exception line: a real error that happens to say "deprecated" must stay visible.
_NOT_EXCEPTION = r"^(?![\w.]+(?:Error|Exception)\b)"

# specconsole's own requests (tui/agent/health.py, from the GPU host to 127.0.0.1) in
# uvicorn's access log; a user's own /health from elsewhere stays visible
_PROBES = _rule("specconsole-probe", "hide", "- \"GET /",
                r'^127\.0\.0\.1:\d+ - "GET /(?:health|metrics|v1/models) HTTP/1\.[01]" \d{3}',
                "specconsole's own probes")

# Harmless rules come first: a known error must be labelled even if it also says "deprecated".
_VLLM_RULES: tuple[NoiseRule, ...] = (
    _rule("triton-kernels-import", "harmless", "Triton kernels",
          r"Failed to import Triton kernels", "Triton kernels unavailable (harmless)"),
    _rule("rocm-legacy-triton", "harmless", "legacy triton_kernels",
          r"Using legacy triton_kernels on ROCm", "legacy triton_kernels on ROCm"),
    _rule("vllm-c-missing", "harmless", "vllm._C",
          r"Failed to import from vllm\._C with ModuleNotFoundError",
          "vllm._C missing (harmless on CPU/plugin platforms; on CUDA a broken build)"),
    _BLANK,
    _PROBES,
    _rule("future-warning", "hide", "Warning:", r"(?:Future|Deprecation)Warning:",
          "Future/DeprecationWarning (e.g. cuda.cudart, cuda.nvrtc)"),
    _rule("syntax-warning-escape", "hide", "SyntaxWarning",
          r"SyntaxWarning: invalid escape sequence", "SyntaxWarning: invalid escape sequence"),
    _rule("syntax-warning-escape-source", "hide", "\\emoji", r"\\emoji \\emoji",
          "source line of the invalid-escape SyntaxWarning"),
    _rule("warnings-warn-source", "hide", "warnings.warn(", r"^\s+warnings\.warn\(",
          "source line of a Python warning"),
    _rule("deprecated", "hide", "deprecat", _NOT_EXCEPTION + r".*\bdeprecat(?:ed|ion)\b",
          "deprecation notice"),
    _rule("trust-remote-code-ignored", "hide", "trust_remote_code",
          r"trust_remote_code.*(?:no effect|is ignored)", "trust_remote_code has no effect here"),
    _rule("platform-detected", "hide", "Automatically detected platform",
          r"Automatically detected platform", "platform detection"),
    _rule("mq-handle", "hide", "message queue communication handle",
          r"message queue communication handle", "message queue handle"),
    _rule("destroy-process-group", "hide", "destroy_process_group",
          r"destroy_process_group\(\) was not called", "destroy_process_group() not called"),
    _rule("model-positional", "hide", "positional argument",
          r"provide the model as a positional argument", "model given as --model"),
    _rule("ir-op-priority", "hide", "IR op priority", r"Final IR op priority", "IR op priority"),
    _rule("cuda-graph-addresses", "hide", "cuda graph addresses",
          r"Registering \d+ cuda graph addresses", "cuda graph address registration"),
    _rule("exit-leak-report", "hide", "leaked",
          r"nanobind: leaked|^\s*- leaked (?:instance|type|function) "
          r"|resource_tracker.*leaked shared_memory", "leak report at exit"),
    _rule("exit-leak-advice", "hide", "nanobind",
          r"nanobind: this is likely caused by a reference counting issue"
          r"|nanobind\.readthedocs\.io/en/latest/refleaks", "leak report at exit"),
    _rule("exit-leak-elided", "hide", "skipped remainder", r"^\s*- \.\.\. skipped remainder$",
          "leak report at exit"),
    _rule("triton-no-cpu-backend", "hide", "Triton is installed",
          r"Triton is installed, but doesn't include CPU backend",
          "Triton without a CPU backend (CPU build)"),
)

_SGLANG_RULES: tuple[NoiseRule, ...] = (
    _BLANK,
    _PROBES,
    _rule("gloo-connected", "hide", "[Gloo]", r"\[Gloo\] Rank \d+ is connected to",
          "Gloo connection"),
    _rule("custom-allreduce", "harmless", "Custom allreduce",
          r"Setup Custom allreduce failed", "custom allreduce unavailable (non-fatal)"),
)

_BUILTIN = {"vllm": _VLLM_RULES, "sglang": _SGLANG_RULES}


def builtin_rules(engine: str) -> tuple[NoiseRule, ...]:
    """The engine's built-in rules; ValueError for an engine we have none for."""
    try:
        return _BUILTIN[engine]
    except KeyError:
        raise ValueError(f"no noise rules for engine {engine!r}") from None


# A verdict depends on the message alone, and a busy log repeats its noise word for word (a
# warning per request, a FutureWarning and its source line): verdicts of messages up to this
# long are kept, this many at most (then forgotten, as the log moves on).
_KNOWN_LEN = 1000
_KNOWN_MAX = 4096
_MISS: Any = object()


class NoiseFilter:
    """First matching rule wins; `classify` counts, `match` does not (the root-cause tracker
    asks again about the few lines that could be a cause)."""

    def __init__(self, rules: Iterable[NoiseRule]) -> None:
        self.rules: tuple[NoiseRule, ...] = tuple(rules)
        self._checks = tuple((r.needle, r.pattern.search, r) for r in self.rules
                             if r.pattern is not _BLANK_RE)
        self._unguarded = tuple((search, r) for needle, search, r in self._checks if not needle)
        # Nearly every line holds no needle: these say so with one `in` per needle and no loop.
        held = " or ".join(f"{n!r} in m" for n, _, _ in self._checks if n) or "False"
        self._any_needle: Callable[[str], bool] = _compiled(f"lambda m: {held}")
        self.hidden: dict[str, int] = {}
        self.harmless: dict[str, int] = {}
        self._known: dict[str, NoiseRule | None] = {}  # message -> verdict (see _KNOWN_MAX)
        self._by_id = {id(r): r for r in self.rules}  # a chunk's verdicts are counted by id

    def match(self, line: LogLine) -> NoiseRule | None:
        msg = line.message
        if not msg or msg.isspace():
            return self._blank(msg)
        if not self._any_needle(msg):  # most lines: only the rules without a needle can match
            for search, rule in self._unguarded:
                if search(msg) is not None:
                    return rule
            return None
        for needle, search, rule in self._checks:
            if needle:
                if needle in msg and search(msg) is not None:
                    return rule
            elif search(msg) is not None:
                return rule
        return None

    def _blank(self, msg: str) -> NoiseRule | None:
        return next((r for r in self.rules if r.matches(msg)), None)

    def classify(self, line: LogLine) -> NoiseRule | None:
        rule = self.match(line)
        if rule is not None:
            self._count(rule)
        return rule

    def classify_all(self, lines: Sequence[LogLine]) -> list[NoiseRule | None]:
        """`classify` for each line of a chunk, in order."""
        rules = self.match_all(lines)
        self.count_all(rules)
        return rules

    def count_all(self, rules: Iterable[NoiseRule | None]) -> None:
        """Count the verdicts of a chunk's lines (made by `match_all`, or by context)."""
        tally = Counter(map(id, rules))  # in C: a chunk has a handful of distinct verdicts
        tally.pop(id(None), None)
        by_id = self._by_id
        if not tally.keys() <= by_id.keys():  # a rule from elsewhere: counted one by one
            for rule in rules:
                if rule is not None:
                    self._count(rule)
            return
        for key, n in tally.items():
            self._count(by_id[key], n)

    def match_all(self, lines: Sequence[LogLine]) -> list[NoiseRule | None]:
        """`match` for each line of a chunk, in order (nothing counted); a message judged
        recently is not judged again (a verdict depends on the message alone)."""
        known = self._known
        get = known.get
        out: list[NoiseRule | None] = []
        append = out.append
        for line in lines:
            msg = line.message
            rule = get(msg, _MISS)
            if rule is _MISS:
                rule = self.match(line)
                if len(msg) <= _KNOWN_LEN:
                    if len(known) >= _KNOWN_MAX:
                        known.clear()
                    known[msg] = rule
            append(rule)
        return out

    def _count(self, rule: NoiseRule, n: int = 1) -> None:
        counts = self.hidden if rule.kind == "hide" else self.harmless
        counts[rule.id] = counts.get(rule.id, 0) + n


def _compiled(source: str) -> Any:
    """A lambda from generated source (the needles are written as literals with repr)."""
    return eval(compile(source, "<noise needles>", "eval"), {})
