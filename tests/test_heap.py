"""The console's heap policy (tui/heap.py): no automatic full collections while it runs, one at a
quiet moment and at least every few minutes, the thresholds back afterwards; Textual's caches
leave no cyclic garbage. These are what took the firehose's frozen frames away."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import until
from rich.segment import Segment
from textual.cache import LRUCache
from textual.strip import Strip

from tui.console.app import ConsoleApp
from tui.console.heap import NEVER, QuietCollector, untie_textual_caches
from tui.core.profile import load_profile
from tui.supervise.supervisor import Supervisor

PROFILES = Path(__file__).parent.parent / "profiles"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """CPython's defaults during the test, whatever ran before; the previous ones after."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


def _churn(total: int = 300_000, held: int = 50_000) -> None:
    """The firehose in small: cyclic objects that live a while (a window holds the latest) and
    so reach generation 2 before they die, as the log lines and drawn strips did."""
    window: deque[list[object]] = deque(maxlen=held)
    for _ in range(total):
        cycle: list[object] = []
        cycle.append(cycle)
        window.append(cycle)


def test_no_automatic_full_collection_while_installed(thresholds: tuple[int, int, int]) -> None:
    """The same churn that makes CPython collect generation 2 on its own makes none under the
    policy, while generation 0 keeps collecting; the thresholds are restored on exit."""
    full, young = gc.get_stats()[2]["collections"], gc.get_stats()[0]["collections"]
    _churn()
    assert gc.get_stats()[2]["collections"] > full  # without the policy: full passes
    with QuietCollector():
        assert gc.get_threshold() == (700, 10, NEVER)
        full, young = gc.get_stats()[2]["collections"], gc.get_stats()[0]["collections"]
        _churn()
        assert gc.get_stats()[2]["collections"] == full
        assert gc.get_stats()[0]["collections"] > young + 100
    assert gc.get_threshold() == thresholds


def test_full_collection_once_quiet(thresholds: tuple[int, int, int]) -> None:
    """Busy (lines, keys): no pass; a second of quiet after as much promotion as would have
    started one: one pass, then none until something reaches generation 2 again."""
    clock = Clock()
    with QuietCollector(quiet_s=1.0, every_s=300.0, clock=clock) as heap:
        for _ in range(thresholds[2] + 1):
            gc.collect(1)  # each young pass promotes: generation 2's count goes up by one
        heap.busy()
        clock.now = 0.5
        assert not heap.poll()
        heap.busy()
        clock.now = 1.2
        assert not heap.poll()  # 0.7 s since the last line: not quiet yet
        full = gc.get_stats()[2]["collections"]
        clock.now = 2.3
        assert heap.poll()
        assert gc.get_stats()[2]["collections"] == full + 1
        assert (heap.quiet_passes, heap.forced_passes) == (1, 0)
        clock.now = 10.0
        assert not heap.poll()  # nothing promoted since the pass


def test_forced_full_collection_under_endless_lines(thresholds: tuple[int, int, int]) -> None:
    """Never quiet (a line every quarter second): one pass anyway once `every_s` has gone by,
    so cyclic garbage stays bounded."""
    clock = Clock()
    with QuietCollector(quiet_s=1.0, every_s=300.0, clock=clock) as heap:
        ran = []
        while clock.now < 400.0:
            clock.now += 0.25
            heap.busy()
            gc.collect(1)
            if heap.poll():
                ran.append(clock.now)
        assert ran == [300.0]
        assert (heap.quiet_passes, heap.forced_passes) == (0, 1)


def test_textual_caches_leave_no_cyclic_garbage() -> None:
    """A strip already the asked length, crop or division returns itself; before untying, it
    also kept itself in its own cache (a cycle per drawn line), and a cleared LRU cache dropped
    its ring of links whole. Untied, reference counting frees them: a full pass finds nothing."""
    untie_textual_caches()
    gc.collect()
    for _ in range(200):
        strip = Strip([Segment("abc")], 3)
        assert strip.adjust_cell_length(3) is strip
        assert strip.crop_extend(0, 3, None) is strip
        assert strip.divide([3])[0] is strip
        cache: LRUCache[int, str] = LRUCache(8)
        for key in range(5):
            cache[key] = str(key)
        cache.clear()
        assert cache.get(1) is None
    del strip, cache
    assert gc.collect() < 50  # tied: over 500 here (young passes free the rest)


async def test_the_console_polls_the_collector_and_keys_make_it_busy() -> None:
    """Wired in: the console's timer polls the collector, and a key press marks it busy (so a
    full pass waits for a quiet second)."""
    clock = Clock()
    heap = QuietCollector(clock=clock)
    polls: list[float] = []
    original = heap.poll

    def poll() -> bool:
        polls.append(clock.now)
        return original()

    heap.poll = poll  # type: ignore[method-assign]
    app = ConsoleApp(Supervisor(load_profile(PROFILES / "demo.toml")), launch=False, heap=heap)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: polls, 10, "a poll (every quarter second)")
        clock.now = 42.0
        await pilot.press("f")
        assert heap.last_busy == 42.0
        await app.sup.close()
