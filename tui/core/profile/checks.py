"""The profile's mechanism, shared by every table: the generic validator (a table of
checks per section, one small `_check_table` that runs it, `_Invalid` carrying the key path),
`${NAME}` expansion, durations, the line a key path is written on, and `Table`, how a table's
module registers with the loader (tui.core.profile.loader).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tui.core.errors import ProfileError


@dataclass(frozen=True, slots=True)
class Table:
    """One top-level table of the profile, as its module registers it with the loader: its
    name, the check that reads it into its dataclass, its values where `${NAME}` is expanded
    (key paths below the table), and what it does not combine with, checked once every table
    is read and the hosts are resolved (None: nothing)."""

    name: str
    check: Check
    expanded: tuple[tuple[str, ...], ...] = ()
    beside: Callable[[dict[str, Any]], None] | None = None


def parse_duration(value: str | float) -> float:
    """Seconds from "25m", "1h30m", "90s", "1.5h", "90" or a number; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a duration, got {_describe(value)}")
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION.fullmatch(text)
            if not text or match is None:
                raise ValueError(
                    f"invalid duration {value!r} (use e.g. \"25m\", \"1h30m\", \"90s\" or seconds)"
                ) from None
            hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
            seconds = hours * 3600 + minutes * 60 + secs
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: not a finite number")
    return seconds


def expand_vars(text: str, environ: Mapping[str, str], used: list[str] | None = None) -> str:
    """`${NAME}` and `${NAME:-default}` (the default may hold references itself) from `environ`.

    Only the braced form is expanded, so a literal `$` elsewhere stays as written; an unset
    `${NAME}` without a default is a ValueError naming the variable. Each value taken from
    `environ` is appended to `used` (the values a profile must keep secret).
    """
    out: list[str] = []
    at = 0
    while (start := text.find("${", at)) >= 0:
        out.append(text[at:start])
        name = _ENV_NAME.match(text, start + 2)
        if name is None:
            raise ValueError(f"bad variable reference in {text!r}: expected ${{NAME}}")
        after = name.end()
        if text.startswith("}", after):
            if name.group() not in environ:
                raise ValueError(f"${{{name.group()}}} is not set (export it, or write "
                                 f"${{{name.group()}:-default}})")
            out.append(environ[name.group()])
            if used is not None:
                used.append(environ[name.group()])
            at = after + 1
        elif text.startswith(":-", after):
            end = _closing_brace(text, after + 2)
            default = text[after + 2:end]
            if environ.get(name.group()):
                out.append(environ[name.group()])
                if used is not None:
                    used.append(environ[name.group()])
            else:
                out.append(expand_vars(default, environ, used))
            at = end + 1
        else:
            raise ValueError(f"bad variable reference in {text!r}: expected ${{NAME}} "
                             "or ${NAME:-default}")
    out.append(text[at:])
    return "".join(out)


def _closing_brace(text: str, at: int) -> int:
    depth = 1
    for i in range(at, len(text)):
        if text.startswith("${", i):
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unclosed variable reference in {text!r}")


# --- the generic validator --------------------------------------------------------------------

class _Invalid(Exception):
    """A bad value; `sub` is the key path below the table being checked (".port", "[2].label")."""

    def __init__(self, message: str, sub: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.sub = sub


Check = Callable[[Any], Any]
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               list: "an array", dict: "a table"}


def _describe(value: Any) -> str:
    kind = _TYPE_NAMES.get(type(value), "a date/time")
    if isinstance(value, bool):
        return f"{kind} ({str(value).lower()})"
    if isinstance(value, (int, float, str)):
        shown = repr(value)
        return f"{kind} ({shown if len(shown) <= 40 else shown[:37] + '...'})"
    return kind


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _typed(types: tuple[type, ...], name: str) -> Check:
    def check(value: Any) -> Any:
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise _Invalid(f"expected {name}, got {_describe(value)}")
        return value
    return check


_str = _typed((str,), "a string")
_int = _typed((int,), "an integer")
_number = _typed((int, float), "a number")
_bool = _typed((bool,), "a boolean (true or false)")


def _float(value: Any) -> float:
    number = float(_number(value))
    if not math.isfinite(number):
        raise _Invalid(f"expected a finite number, got {value}")
    return number


def _bounded(check: Check, low: float, high: float | None = None, strict: bool = False) -> Check:
    def bounded(value: Any) -> Any:
        value = check(value)
        if (value <= low if strict else value < low) or (high is not None and value > high):
            wanted = (f"between {low} and {high}" if high is not None
                      else f"{'>' if strict else '>='} {low}")
            raise _Invalid(f"must be {wanted}, got {value}")
        return value
    return bounded


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(value: Any) -> str:
        if _str(value) not in choices:
            raise _Invalid(f"unknown value {value!r}{_suggest(value, choices)}; "
                           f"expected one of: {', '.join(choices)}")
        return value
    return check


def _list(item: Check, nonempty: bool = False) -> Check:
    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _Invalid(f"expected an array, got {_describe(value)}")
        if nonempty and not value:
            raise _Invalid("must not be empty")
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except _Invalid as e:
                raise _Invalid(e.message, f"[{index}]{e.sub}") from None
        return tuple(out)
    return check


def _env_name(value: Any) -> str:
    if not _ENV_NAME.fullmatch(_str(value)):
        raise _Invalid(f"{value!r} is not an environment variable name")
    return value


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected a table of NAME = \"value\", got {_describe(value)}")
    for name, text in value.items():
        try:
            _env_name(name)
            _str(text)
        except _Invalid as e:
            raise _Invalid(e.message, f".{name}") from None
    return dict(value)


def _duration(value: Any) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise _Invalid(str(e)) from None
    if seconds <= 0:
        raise _Invalid(f"must be > 0, got {value!r}")
    return seconds


def _regex(value: Any) -> re.Pattern[str]:
    try:
        return re.compile(_str(value))
    except re.error as e:
        raise _Invalid(f"invalid regex {value!r}: {e}") from None


def _json_value(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        raise _Invalid(f"{_describe(value)} cannot be passed to the engine as JSON") from None
    return value


def _check_table(data: Any, table: Mapping[str, Check], required: tuple[str, ...] = (),
                 extra: Check | None = None) -> dict[str, Any]:
    """Check each key of `data` against `table`; absent keys keep the dataclass default.

    Keys not in the table are refused with the closest valid key, or, when `extra` is given,
    checked by it and collected under "extra" (pass-through keys).
    """
    if not isinstance(data, dict):
        raise _Invalid(f"expected a table, got {_describe(data)}")
    values: dict[str, Any] = {}
    passed: dict[str, Any] = {}
    for key, value in data.items():
        check = table.get(key, extra)
        if check is None:
            kind = "table" if isinstance(value, dict) else "key"
            hint = _suggest(key, table) or f"; valid keys: {', '.join(table)}"
            raise _Invalid(f"unknown {kind} {key!r}{hint}", f".{key}")
        try:
            (values if key in table else passed)[key] = check(value)
        except _Invalid as e:
            raise _Invalid(e.message, f".{key}{e.sub}") from None
    for key in required:
        if key not in values:
            raise _Invalid(f"missing required key {key!r}", f".{key}")
    if extra is not None:
        values["extra"] = passed
    return values


def _section(cls: type, table: Mapping[str, Check], required: tuple[str, ...] = (),
             extra: Check | None = None,
             post: Callable[[dict[str, Any]], None] | None = None) -> Check:
    def check(value: Any) -> Any:
        values = _check_table(value, table, required, extra)
        if post is not None:
            post(values)
        return cls(**values)
    return check


_POSITIVE = _bounded(_float, 0, strict=True)


# --- where in the text: line numbers by scanning ----------------------------------------------

_HEADER = re.compile(r"\s*(\[\[?)\s*([^\[\]]+?)\s*\]")
_KEY = re.compile(r"\s*([A-Za-z0-9_\-.\"' ]+?)\s*=(.*)")
_ITEM = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|\{[^{}]*\}")
_LAST_PART = re.compile(r"(?:^|\.)[^.\[\]]+$|\[\d+\]$")
_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def _syntax_error(path: str, text: str, message: str) -> ProfileError:
    """tomllib says "(at line L, column C)" or "(at end of document)"; keep both as numbers."""
    at = _AT.search(message)
    line = column = None
    if at is not None:
        message = message[:at.start()]
        if at.group(1):
            line, column = int(at.group(1)), int(at.group(2))
        else:
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
    return ProfileError(path, f"TOML syntax error: {message}", line=line, column=column)


def _dotted(key: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in key.split("."))


def _key_lines(text: str) -> dict[str, int]:
    """Map key paths ("server.port", "logs.hide[1]") to the line that first defines them.

    A heuristic over the text: headers, `key = value` lines, `[[array]]` tables and the items of
    a multi-line array written one string or inline table at a time. Good enough to point at a
    line; when it cannot, the caller falls back to the enclosing key.
    """
    found: dict[str, int] = {}
    table = ""
    counts: dict[str, int] = {}
    array: tuple[str, int] | None = None  # (path, next item index) inside a multi-line array
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if array is not None:
            if stripped.startswith("]"):
                array = None
            elif not stripped.startswith("#"):
                path, index = array
                for _ in _ITEM.findall(line):
                    found.setdefault(f"{path}[{index}]", number)
                    index += 1
                array = (path, index)
            continue
        header = _HEADER.match(line)
        if header is not None:
            table = _dotted(header.group(2))
            if header.group(1) == "[[":
                counts[table] = counts.get(table, -1) + 1
                table = f"{table}[{counts[table]}]"
            found.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key is not None:
            path = f"{table}.{_dotted(key.group(1))}" if table else _dotted(key.group(1))
            found.setdefault(path, number)
            if re.fullmatch(r"\s*\[\s*(#.*)?", key.group(2)):
                array = (path, 0)
    return found


def _find_line(text: str, key: str) -> int | None:
    """The line of `key`, or of the nearest enclosing key or table the text shows."""
    lines = _key_lines(text)
    while key in lines or _LAST_PART.search(key):
        if key in lines:
            return lines[key]
        key = _LAST_PART.sub("", key)
    return None
