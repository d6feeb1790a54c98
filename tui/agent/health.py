"""The health thread: the server's health paths off the main loop, so a hung server never
delays a death."""

from __future__ import annotations

import threading
import time

from .http_client import http_request
from .wire import emit

CONFIRM_EVERY = 10  # health ticks between checks of the paths after the first, once healthy


class Health(threading.Thread):
    """GET the server's health paths off the main loop (a hung server must not delay deaths);
    while it is healthy, also the metrics lines that start with `metrics_prefix`, now and then."""

    def __init__(self, port: int, paths: list[str], interval: float,
                 metrics: tuple[str, str, float] | None = None) -> None:
        super().__init__(daemon=True, name="health")
        self.port, self.paths, self.interval = port, paths, interval
        self.metrics = metrics  # (path, line prefix, interval)
        self.stop = threading.Event()
        self.last: dict[str, bool] = {}

    def run(self) -> None:
        """Until every path has answered, each is asked every tick; then the first (the
        liveness check, /health) every tick and the others (/v1/models: still serving the
        model) every CONFIRM_EVERY ticks, again every tick once any fails: half the requests
        of a healthy server, the agent's largest cost while it watches."""
        next_metrics = 0.0
        tick = 0
        while not self.stop.is_set():
            healthy = len(self.last) == len(self.paths) and all(self.last.values())
            confirm = not healthy or tick % CONFIRM_EVERY == 0
            tick += 1
            for path in self.paths if confirm else self.paths[:1]:
                status, _ = http_request(self.port, path, timeout=1)
                ok = status is not None and 200 <= status < 300
                if self.stop.is_set():
                    return
                if self.last.get(path) != ok:
                    self.last[path] = ok
                    emit("health", ok=ok, path=path, status=status, time=time.time())
            if self.metrics is not None and all(self.last.values()) \
                    and time.monotonic() >= next_metrics:
                path, prefix, every = self.metrics
                next_metrics = time.monotonic() + every
                status, body = http_request(self.port, path, timeout=2)
                if status == 200:
                    text = body.decode("utf-8", "replace")
                    lines = [x for x in text.splitlines() if x.startswith(prefix)]
                    if lines:
                        emit("metrics", path=path, text="\n".join(lines), time=time.time())
            self.stop.wait(self.interval)
