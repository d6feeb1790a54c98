"""Launch history: every launch recorded locally in sqlite, for `specconsole history`, the
console's "last launch" line and each phase's expected duration (the ETA); and the errors each
profile's launches logged and survived to READY, which later diagnoses never name as a cause
while another is known (tui.core.ranking: the Triton-import-ERROR class, learned per profile
instead of listed by hand). A Slurm job's launch also keeps the job's id, its node(s), its wait
in the queue and the scheduler's end in words; a database from before those columns gains them
when opened (_migrate), its rows kept.

Lives in the user data directory (platformdirs; `SPECCONSOLE_DATA_DIR` overrides it). Written by
the supervisor, so the console and `wait` both record; commands are stored with secrets
redacted. A history that cannot be written never stops a launch: it is a convenience.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import platformdirs

from tui.core.units import duration

SCHEMA = """
CREATE TABLE IF NOT EXISTS launches (
    run_id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    host TEXT NOT NULL,
    command TEXT,
    args TEXT NOT NULL DEFAULT '[]',
    env_names TEXT NOT NULL DEFAULT '[]',
    engine_version TEXT,
    started REAL NOT NULL,
    outcome TEXT NOT NULL,
    took REAL,
    exit_code INTEGER,
    cause TEXT,
    phases TEXT NOT NULL DEFAULT '[]',
    ended REAL,
    job_id TEXT,
    nodes TEXT NOT NULL DEFAULT '[]',
    queued REAL,
    job_end TEXT
);
CREATE INDEX IF NOT EXISTS launches_by_profile ON launches (profile, host, started);
CREATE TABLE IF NOT EXISTS survived (
    profile TEXT NOT NULL,
    host TEXT NOT NULL,
    shape TEXT NOT NULL,
    launches INTEGER NOT NULL,
    last REAL NOT NULL,
    PRIMARY KEY (profile, host, shape)
);
"""
# Columns added since the first schema, each with its type: a database written before them gets
# them (ALTER TABLE ... ADD COLUMN) when it is opened; its rows read them as NULL or the default.
ADDED_COLUMNS = (("job_id", "TEXT"), ("nodes", "TEXT NOT NULL DEFAULT '[]'"),
                 ("queued", "REAL"), ("job_end", "TEXT"))
COLUMNS = ("run_id", "profile", "host", "command", "args", "env_names", "engine_version",
           "started", "outcome", "took", "exit_code", "cause", "phases", "ended",
           *(name for name, _ in ADDED_COLUMNS))
SURVIVED_PER_LAUNCH = 64  # error shapes kept from one launch that reached READY
ETA_SAMPLE = 10  # the last N successful launches give each phase's expected duration


@dataclass(frozen=True, slots=True)
class Launch:
    run_id: str
    profile: str
    host: str
    started: float
    outcome: str = "running"  # running, ready, dead, stalled, stopped
    command: str | None = None
    args: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()
    engine_version: str | None = None
    took: float | None = None  # seconds to READY, when it got there
    exit_code: int | None = None
    cause: str | None = None
    phases: tuple[tuple[str, float, float], ...] = ()  # (label, start s, duration s)
    ended: float | None = None
    # a Slurm job's: its id, its node(s), its wait in the queue, the scheduler's end in words
    job_id: str | None = None
    nodes: tuple[str, ...] = ()
    queued: float | None = None
    job_end: str | None = None

    def summary(self) -> str:
        """How it ended, in words: `READY in 24m50s`, `DEAD after 23.0s: SyntaxError: …`."""
        if self.outcome == "ready" and self.took is not None:
            return f"READY in {duration(self.took)}"
        after = f" after {duration(self.ended - self.started)}" if self.ended else ""
        if self.outcome == "dead":
            code = f" (exit {self.exit_code})" if self.exit_code is not None else ""
            cause = f": {self.cause}" if self.cause else ""
            return f"DEAD{after}{code}{cause}"
        return f"{self.outcome.upper()}{after}"

    def job_summary(self) -> str:
        """A Slurm job's line: `job 494583 on node-07, queued 2m13s; TIMEOUT: the job's 4 h
        time limit ended it, 3 h 58 min after READY`; "" for a bare launch."""
        if self.job_id is None:
            return ""
        where = f" on {','.join(self.nodes)}" if self.nodes else ""
        queued = f", queued {duration(self.queued)}" if self.queued is not None else ""
        end = f"; {self.job_end}" if self.job_end else ""
        return f"job {self.job_id}{where}{queued}{end}"


def default_path() -> Path:
    base = os.environ.get("SPECCONSOLE_DATA_DIR") or platformdirs.user_data_dir("specconsole")
    return Path(base) / "history.sqlite3"


class History:
    """One sqlite file; each call opens, writes and closes (several consoles may share it)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_path()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(self.path, timeout=2.0)
        db.executescript(SCHEMA)
        _migrate(db)
        return db

    def record(self, launch: Launch) -> None:
        with self._connect() as db:
            db.execute(
                f"INSERT OR REPLACE INTO launches ({', '.join(COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(COLUMNS))})",
                (launch.run_id, launch.profile, launch.host, launch.command,
                 json.dumps(list(launch.args)), json.dumps(list(launch.env_names)),
                 launch.engine_version, launch.started, launch.outcome, launch.took,
                 launch.exit_code, launch.cause, json.dumps([list(p) for p in launch.phases]),
                 launch.ended, launch.job_id, json.dumps(list(launch.nodes)), launch.queued,
                 launch.job_end))
        db.close()

    def update(self, run_id: str, **changes: object) -> Launch | None:
        """Change some fields of a recorded launch (None if it was never recorded)."""
        launch = self.get(run_id)
        if launch is None:
            return None
        launch = replace(launch, **changes)  # type: ignore[arg-type]
        self.record(launch)
        return launch

    def get(self, run_id: str) -> Launch | None:
        """A launch by run id, or by a unique prefix of it."""
        rows = self._select("WHERE run_id = ? OR run_id LIKE ? ORDER BY run_id = ? DESC",
                            (run_id, run_id.replace("%", "") + "%", run_id))
        if len(rows) > 1 and rows[0].run_id != run_id:
            raise LookupError(f"{run_id!r} matches {len(rows)} launches; give more of it")
        return rows[0] if rows else None

    def launches(self, profile: str | None = None, host: str | None = None,
                 limit: int = 50) -> list[Launch]:
        """Newest first."""
        where, params = _where(profile, host)
        return self._select(f"{where} ORDER BY started DESC LIMIT ?", (*params, limit))

    def last(self, profile: str, host: str, before: str | None = None) -> Launch | None:
        """The newest launch of this profile on this host (other than `before`)."""
        for launch in self.launches(profile, host, limit=2):
            if launch.run_id != before:
                return launch
        return None

    def expected_phases(self, profile: str, host: str) -> dict[str, float]:
        """Median duration of each phase over the last successful launches."""
        durations: dict[str, list[float]] = {}
        ready = [x for x in self.launches(profile, host, limit=200) if x.took is not None]
        for launch in ready[:ETA_SAMPLE]:
            for label, _, took in launch.phases:
                durations.setdefault(label, []).append(took)
        return {label: statistics.median(values) for label, values in durations.items()}

    def note_survived(self, profile: str, host: str, shapes: Iterable[str], at: float) -> None:
        """A launch reached READY having logged these error shapes (tui.core.ranking.shape;
        from redacted lines)."""
        rows = [(profile, host, s, at) for s in list(shapes)[:SURVIVED_PER_LAUNCH]]
        if not rows:
            return
        with self._connect() as db:
            db.executemany(
                "INSERT INTO survived VALUES (?,?,?,1,?) ON CONFLICT (profile, host, shape) "
                "DO UPDATE SET launches = launches + 1, last = excluded.last", rows)
        db.close()

    def survived(self, profile: str, host: str) -> frozenset[str]:
        """The error shapes launches of this profile on this host survived to READY."""
        with self._connect() as db:
            rows = db.execute("SELECT shape FROM survived WHERE profile = ? AND host = ?",
                              (profile, host)).fetchall()
        db.close()
        return frozenset(row[0] for row in rows)

    def _select(self, clause: str, params: Iterable[object]) -> list[Launch]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM launches {clause}",
                              tuple(params)).fetchall()
        db.close()
        return [_launch(row) for row in rows]


def _migrate(db: sqlite3.Connection) -> None:
    """Add the columns a database written by an earlier version lacks (ADDED_COLUMNS); another
    process adding the same one at the same time is no error."""
    have = {row[1] for row in db.execute("PRAGMA table_info(launches)")}
    for name, kind in ADDED_COLUMNS:
        if name not in have:
            try:
                db.execute(f"ALTER TABLE launches ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):
                    raise


def _where(profile: str | None, host: str | None) -> tuple[str, tuple[str, ...]]:
    parts, params = [], []
    if profile is not None:
        parts.append("profile = ?")
        params.append(profile)
    if host is not None:
        parts.append("host = ?")
        params.append(host)
    return ("WHERE " + " AND ".join(parts) if parts else ""), tuple(params)


def _launch(row: tuple) -> Launch:  # type: ignore[type-arg]
    (run_id, profile, host, command, args, env_names, version, started, outcome, took, code,
     cause, phases, ended, job_id, nodes, queued, job_end) = row
    return Launch(run_id, profile, host, started, outcome, command, tuple(json.loads(args)),
                  tuple(json.loads(env_names)), version, took, code, cause,
                  tuple((p[0], float(p[1]), float(p[2])) for p in json.loads(phases)), ended,
                  job_id, tuple(json.loads(nodes or "[]")), queued, job_end)


def diff(a: Launch, b: Launch) -> list[str]:
    """What changed from launch `a` to launch `b`: args, env names, versions, phase timings."""
    out = []
    removed = [x for x in a.args if x not in b.args]
    added = [x for x in b.args if x not in a.args]
    if removed or added:
        out.append("args: " + " ".join([*(f"-{x}" for x in removed), *(f"+{x}" for x in added)]))
    env_a, env_b = set(a.env_names), set(b.env_names)
    if env_a != env_b:
        out.append("env: " + " ".join([*(f"-{x}" for x in sorted(env_a - env_b)),
                                       *(f"+{x}" for x in sorted(env_b - env_a))]))
    if a.engine_version != b.engine_version:
        out.append(f"engine version: {a.engine_version or '?'} → {b.engine_version or '?'}")
    if a.host != b.host:
        out.append(f"host: {a.host} → {b.host}")
    phases_a = {label: took for label, _, took in a.phases}
    for label, _, took in b.phases:
        if label in phases_a and abs(took - phases_a[label]) >= max(1.0, 0.1 * phases_a[label]):
            out.append(f"{label}: {duration(phases_a[label])} → {duration(took)}")
    for label in phases_a.keys() - {label for label, _, _ in b.phases}:
        out.append(f"{label}: {duration(phases_a[label])} → not reached")
    if (a.outcome, a.took) != (b.outcome, b.took):
        out.append(f"outcome: {a.summary()} → {b.summary()}")
    return out
