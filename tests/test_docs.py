"""The README and docs/ say only what exists: every relative link reaches a file (and a heading,
for `#anchor`), every `specconsole SUBCOMMAND --option` shown in code is one the CLI has, and
every profile shown in a ```toml block parses with the real profile parser."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tui.cli.main import build_parser
from tui.core.profile import loads_profile

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^()\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The text without its code: fenced blocks and inline code spans hold no links."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slugs(text: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation but - and _ dropped, spaces to -, and
    a repeated heading's anchor suffixed -1, -2, ..."""
    seen: Counter[str] = Counter()
    found = set()
    for _, title in _HEADING.findall(_FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that leads nowhere: a missing file, a path outside the
    repository, or an anchor no heading of the markdown file it names has."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text("utf-8")):
            broken.append(f"{target}: no heading '#{anchor}' in {file.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_path_points_outside_the_repository(page: Path) -> None:
    assert "../shared" not in page.read_text(encoding="utf-8")


def test_every_docs_page_is_linked_from_the_readme_or_another_page() -> None:
    linked = {(page.parent / target.partition("#")[0]).resolve()
              for page in PAGES
              for target in _LINK.findall(_prose(page.read_text(encoding="utf-8")))
              if target.partition("#")[0].endswith(".md")}
    assert [str(p.relative_to(ROOT)) for p in PAGES[1:] if p not in linked] == []


def test_slugs_follow_githubs_rules() -> None:
    text = "# `wait` exit codes\n## Several runs: the fleet view\n## A `[container]` profile\n" \
           "## Tests\n## Tests\n```\n# not a heading\n```\n"
    assert slugs(text) == {"wait-exit-codes", "several-runs-the-fleet-view",
                           "a-container-profile", "tests", "tests-1"}


# -- the commands the README shows --------------------------------------------------------------

def _code(text: str) -> list[str]:
    """Every command-like piece of code: each line of a fenced block, each inline span (a
    table's `\\|` is its alternative bar, not a pipe)."""
    pieces = [line for _, body in _FENCE.findall(text) for line in body.splitlines()]
    pieces += [span.strip("`") for span in _INLINE_CODE.findall(_FENCE.sub("", text))]
    return [piece.replace("\\|", " ") for piece in pieces]


def shown_commands(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, its --options) for each piece of code that is a `specconsole ...` command
    line; a first word that is not a subcommand's name (a profile's path, `PROFILE`,
    `[PROFILE...]`) is the default command, `console`."""
    shown = []
    for piece in _code(text):
        found = re.match(r"\s*(?:\$\s+)?specconsole((?:[ \t]+[^\s|;&#]+)*)", piece)
        if found is None:
            continue
        words = found.group(1).split()
        if not words or words[0].startswith("-"):
            continue
        name = words[0] if re.fullmatch(r"[a-z][a-z-]*", words[0]) else "console"
        options = [w.strip("[]").split("=")[0] for w in words if w.lstrip("[").startswith("--")]
        shown.append((name, options))
    return shown


def unknown_commands(text: str) -> list[str]:
    """What code in `text` shows that `specconsole --help` does not have."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    unknown = []
    for name, options in shown_commands(text):
        sub = subparsers.get(name)
        if sub is None:
            unknown.append(f"specconsole {name}: no such command")
            continue
        known = {opt for action in sub._actions for opt in action.option_strings}
        unknown += [f"specconsole {name} {opt}: no such option" for opt in options
                    if opt not in known]
    return unknown


def test_the_readme_shows_commands() -> None:
    names = {name for name, _ in shown_commands(README.read_text(encoding="utf-8"))}
    assert {"console", "launch", "wait", "status", "kill", "logs", "stacks", "check", "history",
            "explain", "demo", "attach"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_exists(page: Path) -> None:
    assert unknown_commands(page.read_text(encoding="utf-8")) == []


def test_a_command_or_option_the_cli_lacks_is_found() -> None:
    text = "`specconsole frobnicate PROFILE`, `specconsole wait P --frobnicate`, " \
           "`specconsole kill P --grace 3`\n```sh\nspecconsole wait P --launch || exit $?\n```\n"
    assert unknown_commands(text) == ["specconsole frobnicate: no such command",
                                      "specconsole wait --frobnicate: no such option"]


# -- the profiles the README and docs show --------------------------------------------------

# A fragment (one table, as a page shows it) parses inside the README's minimal profile: the
# tables it lacks come from there, so every key it shows is checked by the real parser.
_ENVIRON = {"HF_TOKEN": "hf_example_token", "HOME": "/home/someone"}


def _tables(block: str) -> set[str]:
    return set(re.findall(r"^\[\[?([\w.]+)\]\]?", block, re.M))


def _minimal_profile() -> str:
    blocks = [body for lang, body in _FENCE.findall(README.read_text(encoding="utf-8"))
              if lang.strip() == "toml"]
    assert blocks, "the README shows a minimal profile in a ```toml block"
    return blocks[0]


def _base_table(name: str) -> str:
    """One table of the README's minimal profile, as text."""
    found = re.search(rf"^\[{name}\]\n(?:(?!\[).*\n?)*", _minimal_profile(), re.M)
    assert found, f"the README's minimal profile has no [{name}]"
    return found.group(0)


def as_profile(block: str) -> str:
    tables = _tables(block)
    missing = []
    if not tables & {"host", "hosts"}:
        missing.append(_base_table("host"))
    if "server" not in tables:
        missing.append(_base_table("server"))
    return "\n".join([*missing, block])


def toml_blocks(page: Path) -> list[str]:
    return [body for lang, body in _FENCE.findall(page.read_text(encoding="utf-8"))
            if lang.strip() == "toml"]


_BLOCKS = [(page, i, block) for page in PAGES for i, block in enumerate(toml_blocks(page))]


def test_the_readmes_minimal_profile_is_short_and_whole() -> None:
    block = _minimal_profile()
    lines = [line for line in block.splitlines() if line.strip()]
    assert 6 <= len(lines) <= 10
    assert loads_profile(block, "profiles/kimi.toml", _ENVIRON).server.model


@pytest.mark.parametrize(("page", "index", "block"), _BLOCKS,
                         ids=[f"{p.relative_to(ROOT)}#{i}" for p, i, _ in _BLOCKS])
def test_every_profile_shown_parses(page: Path, index: int, block: str) -> None:
    loads_profile(as_profile(block), f"{page.name}-block-{index}.toml", _ENVIRON)


def test_a_key_the_parser_lacks_is_refused() -> None:
    from tui.core.errors import ProfileError
    with pytest.raises(ProfileError, match="frobnicate"):
        loads_profile(as_profile("[expect]\nfrobnicate = 1\n"), "x.toml", _ENVIRON)
