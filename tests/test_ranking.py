"""The root-cause ranking (tui/core/ranking.py): its weights file, its tiers, its order."""

from __future__ import annotations

import pytest

from tui.core.ranking import (
    FEATURES,
    WEIGHTS_PATH,
    Facts,
    Ranker,
    parse_weights,
    reasons,
    shape,
    shipped,
    tier,
)


def facts(text: str, *, level: str | None = None, traceback_end: bool = True, weak: bool = False,
          elsewhere: bool = False) -> Facts:
    return Facts(text, level, traceback_end, weak, elsewhere, False)


def test_the_shipped_weights_are_the_files_numbers_for_every_feature() -> None:
    """The file read here by hand (a `name number` line each, `#` lines aside), not by the
    parser under test: the shipped ranker carries exactly those numbers."""
    written = {}
    for line in WEIGHTS_PATH.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, value = line.split()
            written[name] = float(value)
    assert set(written) == set(FEATURES)
    assert dict(shipped().weights) == written


def test_a_weights_text_parses_to_its_numbers() -> None:
    text = "# trained on 3 logs\nfirst 1.007\n\nlast -0.95  # a comment\norder -1.5e-2\n"
    assert parse_weights(text) == {"first": 1.007, "last": -0.95, "order": -0.015}


@pytest.mark.parametrize(("line", "masked"), [
    ("Failed to load plugin vllm_ext: ImportError: libext.so.12: cannot open it",
     "Failed to load plugin vllm_ext: ImportError: libext.so.#: cannot open it"),
    ("(pid=4012)  Worker at  0x7f3a2c1b9e50   died", "(pid=#) Worker at # died"),
])
def test_a_shape_masks_numbers_and_spacing(line: str, masked: str) -> None:
    assert shape(line) == masked


@pytest.mark.parametrize(("text", "said"), [
    ("fist 1.0\n", "w.txt:1: unknown feature 'fist'"),
    ("# a comment\nfirst one\n", "w.txt:2: first: not a number: 'one'"),
])
def test_a_bad_weights_file_names_its_line(text: str, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_weights(text, "w.txt")
    assert str(caught.value) == said


def test_a_report_of_a_failure_elsewhere_or_a_broken_pipe_is_chosen_only_alone() -> None:
    """The tiers stand above any weight: the story's SyntaxError, last, beats the model
    inspection's CalledProcessError, first; so does a ValueError beat an EOFError before it."""
    greedy = Ranker({"first": 100.0})
    inspection = [facts("subprocess.CalledProcessError: Command 'x' returned 1.",
                        elsewhere=True),
                  facts("SyntaxError: invalid syntax (/tmp/patch/llama.py, line 27)")]
    assert greedy.order(inspection)[0][1] == 1
    pipe = [facts("EOFError"), facts("ConnectionResetError: [Errno 104] Connection reset by "
                                     "peer"), facts("ValueError: bad rope_scaling")]
    assert [tier(f) for f in pipe] == [1, 1, 0]
    assert greedy.order(pipe)[0][1] == 2
    alone = [facts("EOFError")]
    assert greedy.order(alone)[0][1] == 0  # alone, it is still said


def test_equal_scores_go_to_the_earlier_and_reasons_say_what_raised_a_score() -> None:
    flat = Ranker({})
    two = [facts("ValueError: a"), facts("ValueError: b")]
    assert [i for _, i, _ in flat.order(two)] == [0, 1]
    ranker = Ranker({"first": 1.0, "traceback_end": 0.5, "last": -1.0})
    (best, _, feats), (_, _, later) = ranker.order(two)
    assert best == 1.5
    assert reasons(ranker, feats) == ["the earliest error", "ends a traceback"]
    assert reasons(ranker, later) == ["ends a traceback"]  # nothing raised it: its kind
