"""Learn the root-cause ranking's weights (tui/core/ranking.txt) from the corpus, and measure
them honestly: grouped cross-validation over the tuning and held-out parts, folds by source
thread (two logs of one thread are never one in training and one in test), beside the hand
rule scored on the same folds; then the sealed part, scored once with weights that never saw it.

    python tests/corpus/train.py [--write] [--check] [--folds 5]

Each log is read once (tui.core.explain.diagnose_file); a fold's weights then rank the
candidates of its test logs and the whole verdict is judged as score.py judges it (outcome,
root cause, symptoms taken as cause). Training data: for every crashed or hung log whose
expected cause line is among its candidates, each (right, wrong) pair of candidates gives the
difference of their features, labelled 1 (and its negation 0); a logistic regression without
intercept (scikit-learn, the `train` extra) learns the weights of a linear ranking.

`--write` trains on tuning + held-out (never sealed) and writes tui/core/ranking.txt; `--check`
fails (exit 1) when the shipped weights differ from what training gives now, so that a changed
feature or corpus is never shipped with stale weights. Needs `pip install scikit-learn` (the
project's `train` extra: `python3 -m tui.bootstrap train`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from score import SYMPTOM, cause_matches, line_matches  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import GroupKFold  # noqa: E402

from tui.core.diagnosis import Diagnosis  # noqa: E402
from tui.core.explain import diagnose_file  # noqa: E402
from tui.core.ranking import (  # noqa: E402
    FEATURES,
    WEIGHTS_PATH,
    Ranker,
    features,
    parse_weights,
    tier,
)

# The hand rule the ranking replaced: the earliest candidate that reports no failure
# elsewhere (rootcause.py before 2026-12-06): the tiers alone, no score.
HAND_RULE = Ranker({})
C = 1.0  # the regression's inverse regularisation strength
ROUND = 3  # decimals kept in ranking.txt
CHECK_TOLERANCE = 2e-3


@dataclass
class Log:
    log_id: str
    thread: str  # the source thread: the cross-validation's group
    meta: dict
    data: bytes
    diagnosis: Diagnosis
    x: list[list[float]]  # the features of each candidate, in the log's order
    tiers: list[int]  # each candidate's tier (tui.core.ranking.tier)
    right: list[int]  # the candidates that are the expected cause


def load(ids: list[str]) -> list[Log]:
    logs = []
    for log_id in sorted(ids):
        path = HERE / "logs" / f"{log_id}.log"
        meta = json.loads(path.with_suffix(".json").read_text())
        data = path.read_bytes()
        d = diagnose_file(path, meta["engine"])
        cands = d.tracker.candidates()
        facts = d.tracker.facts(cands)
        feats = features(facts)
        right = []
        if meta["outcome"] in ("crashed", "hung") and meta["root_cause"]:
            right = [i for i, c in enumerate(cands)
                     if line_matches(c.offset, c.text(), meta["root_cause"], data)]
        logs.append(Log(log_id, meta["source"], meta, data, d,
                        [[f[n] for n in FEATURES] for f in feats],
                        [tier(f) for f in facts], right))
    return logs


def pairs(logs: Sequence[Log]) -> tuple[np.ndarray, np.ndarray]:
    """(right − wrong) feature differences, labelled 1, and their negations, labelled 0: only
    pairs in one tier (across tiers the rule decides, not the score)."""
    xs, ys = [], []
    for log in logs:
        if not log.right or len(log.x) < 2:
            continue
        for r in log.right:
            for w in range(len(log.x)):
                if w in log.right or log.tiers[w] != log.tiers[r]:
                    continue
                diff = np.subtract(log.x[r], log.x[w])
                xs += [diff, -diff]
                ys += [1, 0]
    return np.array(xs), np.array(ys)


def train(logs: Sequence[Log]) -> Ranker:
    x, y = pairs(logs)
    model = LogisticRegression(C=C, fit_intercept=False, max_iter=1000)
    model.fit(x, y)
    return Ranker({n: round(float(w), ROUND) for n, w in zip(FEATURES, model.coef_[0],
                                                             strict=True)})


@dataclass
class Judged:
    cause_ok: bool | None
    outcome_ok: bool
    symptom: bool


def judge(log: Log, ranker: Ranker) -> Judged:
    log.diagnosis.ranker = ranker
    ex = log.diagnosis.verdict()
    meta = log.meta
    wants = meta["outcome"] in ("crashed", "hung")
    cause = ex.root_cause
    return Judged(cause_matches(ex, meta["root_cause"], log.data) if wants else None,
                  ex.outcome == meta["outcome"],
                  cause is not None and not cause.missing and SYMPTOM.search(cause.line)
                  is not None)


def figures(judged: Sequence[Judged]) -> str:
    causes = [j.cause_ok for j in judged if j.cause_ok is not None]
    c, o = sum(causes), sum(j.outcome_ok for j in judged)
    return (f"root cause {100 * c / len(causes):5.1f} % ({c}/{len(causes)}), outcome "
            f"{100 * o / len(judged):5.1f} % ({o}/{len(judged)}), symptoms as cause "
            f"{sum(j.symptom for j in judged)}")


def cross_validate(logs: Sequence[Log], folds: int) -> tuple[list[Judged], list[Judged]]:
    """(learned, hand rule) verdicts of every log, each judged in the fold that left out its
    thread."""
    learned: list[Judged] = []
    hand: list[Judged] = []
    groups = [log.thread for log in logs]
    for train_at, test_at in GroupKFold(n_splits=folds).split(logs, groups=groups):
        ranker = train([logs[i] for i in train_at])
        learned += [judge(logs[i], ranker) for i in test_at]
        hand += [judge(logs[i], HAND_RULE) for i in test_at]
    return learned, hand


def weights_text(ranker: Ranker, logs: Sequence[Log]) -> str:
    lines = ["# the root-cause ranking's weights (tui/core/ranking.py): trained by "
             "tests/corpus/train.py --write", f"# on {len(logs)} logs (the corpus's tuning "
             f"and held-out parts, never the sealed one), {time.strftime('%Y-%m-%d')}"]
    lines += [f"{n} {ranker.weights[n]:g}" for n in FEATURES]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="write tui/core/ranking.txt")
    ap.add_argument("--check", action="store_true", help="fail when ranking.txt is stale")
    args = ap.parse_args(argv)
    split = json.loads((HERE / "split.json").read_text())
    started = time.monotonic()
    known = load([i for i, p in split.items() if p != "sealed"])
    sealed = load([i for i, p in split.items() if p == "sealed"])
    print(f"read {len(known) + len(sealed)} logs in {time.monotonic() - started:.0f} s; "
          f"{sum(bool(g.right) for g in known)} training logs with their cause among the "
          f"candidates, {len(pairs(known)[1]) // 2} pairs")
    learned, hand = cross_validate(known, args.folds)
    print(f"grouped {args.folds}-fold cross-validation, {len({g.thread for g in known})} "
          f"threads, {len(known)} logs (tuning + held-out):")
    print(f"  learned ranking: {figures(learned)}")
    print(f"  hand rule:       {figures(hand)}")
    final = train(known)
    print(f"sealed part ({len(sealed)} logs), trained on all {len(known)} others:")
    print(f"  learned ranking: {figures([judge(g, final) for g in sealed])}")
    print(f"  hand rule:       {figures([judge(g, HAND_RULE) for g in sealed])}")
    print("weights: " + ", ".join(f"{n} {final.weights[n]:g}" for n in FEATURES))
    if args.write:
        WEIGHTS_PATH.write_text(weights_text(final, known), encoding="utf-8")
        print(f"wrote {WEIGHTS_PATH}")
    if args.check:
        shipped = parse_weights(WEIGHTS_PATH.read_text(encoding="utf-8"))
        stale = [n for n in FEATURES
                 if abs(shipped.get(n, 0.0) - final.weights[n]) > CHECK_TOLERANCE]
        if stale:
            print(f"train: {WEIGHTS_PATH.name} is stale ({', '.join(stale)} differ from what "
                  "the corpus trains now): run tests/corpus/train.py --write", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
