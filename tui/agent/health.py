"""The health thread: the server's health paths off the main loop, so a hung server never
delays a death; once the server is healthy, a gentle pace and its metrics."""

from __future__ import annotations

import threading
import time

from .http_client import http_request
from .wire import emit

# once healthy, the serving ticks between a /health next to the metrics (the engine's own
# verdict: /metrics answers while the engine behind it is dead) and between checks of the
# other paths (/v1/models: still serving the model)
HEALTH_EVERY = 6
CONFIRM_EVERY = 30


class Health(threading.Thread):
    """GET the server's health paths off the main loop (a hung server must not delay deaths).

    Until every path has answered, each is asked every `interval` (readiness is confirmed at
    once). Then one request every `serving_interval`: the metrics when asked for them (the
    lines that start with one of the prefixes, histogram buckets left out), else the first
    path; the first path also every HEALTH_EVERY ticks and whenever the metrics fail, the
    others every CONFIRM_EVERY. Deaths come from the process watch, not from here: a server
    supervised for a week must not find the tool's requests all over its log."""

    def __init__(self, port: int, paths: list[str], interval: float, serving_interval: float,
                 metrics: tuple[str, tuple[str, ...]] | None = None) -> None:
        super().__init__(daemon=True, name="health")
        self.port, self.paths = port, paths
        self.interval, self.serving_interval = interval, serving_interval
        self.metrics = metrics  # (path, line prefixes)
        self.stop = threading.Event()
        self.last: dict[str, bool] = {}

    @property
    def healthy(self) -> bool:
        return len(self.last) == len(self.paths) and all(self.last.values())

    def run(self) -> None:
        tick = 0
        while not self.stop.is_set():
            if not self.healthy:
                tick = 0
                self._ask(self.paths)
                self.stop.wait(self.interval)
                continue
            tick += 1
            scraped = self.metrics is not None and self._scrape()
            if not scraped or tick % HEALTH_EVERY == 0:
                self._ask(self.paths[:1])
            if tick % CONFIRM_EVERY == 0:
                self._ask(self.paths[1:])
            self.stop.wait(self.serving_interval)

    def _ask(self, paths: list[str]) -> None:
        for path in paths:
            status, _ = http_request(self.port, path, timeout=1)
            ok = status is not None and 200 <= status < 300
            if self.stop.is_set():
                return
            if self.last.get(path) != ok:
                self.last[path] = ok
                emit("health", ok=ok, path=path, status=status, time=time.time())

    def _scrape(self) -> bool:
        """One read of the metrics; True when it answered."""
        assert self.metrics is not None
        path, prefixes = self.metrics
        status, body = http_request(self.port, path, timeout=2)
        if status != 200:
            return False
        text = body.decode("utf-8", "replace")
        lines = [x for x in text.splitlines()
                 if x.startswith(prefixes) and "_bucket{" not in x and "_bucket " not in x]
        if lines:
            emit("metrics", path=path, text="\n".join(lines), time=time.time())
        return True
