"""The console's heap: full garbage collections at quiet moments, not mid-firehose.

CPython 3.11 collects generation 2 (every tracked object) once generation 1 has been collected
more than threshold2 times since the last full pass (and enough objects are pending). Under a
20 k lines/s log that was a 50–130 ms pass about every half second (tests/bench/firehose.py).
Two things here. Textual's caches made cyclic garbage on every drawn line, which only those
passes freed (`untie_textual_caches`); untied, a pass finds next to nothing: the log lines are
freed by reference counting, and its time is the walk over what is alive. So while the console
runs, generation 2 is not collected automatically (threshold2 out of reach; generations 0 and 1,
which are cheap, stay on), and the console polls a `QuietCollector` from a timer: it collects
fully once no log line and no key has come for `quiet_s` (after as much promotion as would have
started a pass before), and in any case every `every_s`, so cyclic garbage stays bounded. A
forced pass under a never-ending firehose stops the screen once, for one full pass's time.
The policy is plain `gc` and tested without a screen (tests/test_heap.py).
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

NEVER = 2**31 - 1  # threshold2 out of reach: 2**31 generation-1 passes (gc's thresholds are C ints)
QUIET_S = 1.0  # no log line, no key for this long: a full pass will not be seen
EVERY_S = 300.0  # and one at least this often, quiet or not


def settle_heap() -> None:
    """Before the console runs: Textual's caches stop making cyclic garbage, and what is alive
    now (modules, classes, most of the heap) leaves the garbage collector's full passes for good,
    so the passes the console still makes walk only what it built since."""
    untie_textual_caches()
    gc.collect()
    gc.freeze()


def untie_textual_caches() -> None:
    """Textual (8.2) makes cyclic garbage on every drawn line, which only a full collection frees:
    a Strip that is already the asked length or crop keeps itself in its own cache
    (`adjust_cell_length`, `crop_extend`, `divide`), and `LRUCache.clear` drops its ring of links
    whole. Under the firehose that was 16 k objects a second, promoted before they died (the
    strips live a frame) and freed only by full passes: most of those passes' time. Here a Strip
    that returns itself forgets that cache entry, and a cleared LRU cache unlinks its ring first,
    so reference counting frees both. Idempotent; a Textual without these parts is left alone."""
    from textual.cache import LRUCache
    from textual.strip import Strip

    if getattr(Strip, "_untied", False):
        return
    for name, cache in (("adjust_cell_length", "_line_length_cache"),
                        ("crop_extend", "_crop_extend_cache"), ("divide", "_divide_cache")):
        original = getattr(Strip, name, None)
        if original is not None:
            setattr(Strip, name, _forget_self(original, cache))
    clear = getattr(LRUCache, "clear", None)
    if clear is not None and "_cache" in getattr(LRUCache, "__slots__", ()):
        LRUCache.clear = _unlinking(clear)  # type: ignore[method-assign]
    Strip._untied = True  # type: ignore[attr-defined]


def _forget_self(method: Callable[..., Any], cache: str) -> Callable[..., Any]:
    """`method`, except that a result that is (or holds) the strip itself leaves its cache."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if result is self or (isinstance(result, list) and any(s is self for s in result)):
            kept = getattr(self, cache, None)
            if kept is not None:
                kept.clear()
        return result

    return wrapper


def _unlinking(clear: Callable[[Any], None]) -> Callable[[Any], None]:
    """`LRUCache.clear`, breaking the ring of [prev, next, key, value] links first."""

    @functools.wraps(clear)
    def wrapper(self: Any) -> None:
        for link in self._cache.values():
            link.clear()
        clear(self)

    return wrapper


class QuietCollector:
    """Full collections when the console is quiet (and at least every `every_s`), none in
    between; a context manager that installs the thresholds and restores them on exit."""

    def __init__(self, quiet_s: float = QUIET_S, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_s = quiet_s
        self.every_s = every_s
        self.clock = clock
        self.last_busy = clock()
        self.last_full = clock()
        self.saved: tuple[int, int, int] | None = None  # the thresholds before install
        self.quiet_passes = 0
        self.forced_passes = 0

    def __enter__(self) -> QuietCollector:
        self.install()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    def install(self) -> None:
        """Generation 2 is left to `poll`; generations 0 and 1 keep their thresholds."""
        if self.saved is None:
            self.saved = gc.get_threshold()
            gc.set_threshold(self.saved[0], self.saved[1], NEVER)
        self.last_full = self.clock()

    def restore(self) -> None:
        """The thresholds as they were before `install` (the console has exited)."""
        if self.saved is not None:
            gc.set_threshold(*self.saved)
            self.saved = None

    def busy(self) -> None:
        """Log lines arrived or a key was pressed: a pass now could be seen."""
        self.last_busy = self.clock()

    def due(self) -> str | None:
        """"quiet", "forced" or None: whether `poll` would collect now, and why."""
        promoted = gc.get_count()[2]  # generation-1 passes since the last full one
        if promoted == 0:
            return None  # nothing reached generation 2 since: nothing new to look at
        now = self.clock()
        if now - self.last_full >= self.every_s:
            return "forced"
        threshold = self.saved[2] if self.saved is not None else gc.get_threshold()[2]
        if now - self.last_busy >= self.quiet_s and promoted > threshold:
            return "quiet"  # as much churn as started a full pass before, and nothing to see
        return None

    def poll(self) -> bool:
        """Called from the console's timer: one full pass when due; True if it ran one."""
        why = self.due()
        if why is None:
            return False
        gc.collect()
        self.last_full = self.clock()
        if why == "forced":
            self.forced_passes += 1
        else:
            self.quiet_passes += 1
        return True
