"""What a new user saw in the first ten minutes at 160×45 and 200×50: the log's compact form
(the process as a short tag, the level as a mark, the time as a gutter; the raw view as
written), the root-cause and exception lines wrapped instead of cut, and a timeline that says
what is below its edge. The GPU rows' widths are in test_console_bits; the hangup in
test_hangup."""

from __future__ import annotations

from pathlib import Path

from replay import ReplaySupervisor, serving_script
from textual.app import App, ComposeResult

from tui.console.app import ConsoleApp
from tui.console.messages import RootCauseFound
from tui.console.widgets.compact import GUTTER, process_tag
from tui.console.widgets.logs import CAUSE_MARK, RUNNER_UP_MARK, LogPane, LogView
from tui.core.logwindow import LogWindow, entries
from tui.core.noise import NoiseFilter, builtin_rules
from tui.core.profile import load_profile
from tui.core.protocol import ProcExit
from tui.core.state import LaunchMachine, LinesAdded

PROFILE = Path(__file__).parent.parent / "profiles" / "kimi-k25-eagle3.toml"
CAUSE = ("SyntaxError: trailing comma not allowed without surrounding parentheses "
         "(/tmp/specconsole-sim-23597/kimi_k25_patched.py, line 15)")
LINES = [
    "(Worker_TP1 pid=19506) INFO 12-06 02:37:20 [parallel_state.py:1208] world_size=8 rank=1",
    "(Worker_TP1 pid=19506) ERROR 12-06 02:37:21 [multiproc_executor.py:772] WorkerProc "
    "failed to start.",
    "(Worker_TP1 pid=19506) ERROR 12-06 02:37:21 [multiproc_executor.py:772] Traceback (most "
    "recent call last):",
    '(Worker_TP1 pid=19506) ERROR 12-06 02:37:21 [multiproc_executor.py:772]   File '
    '"/tmp/kimi_k25_patched.py", line 15',
    f"(Worker_TP1 pid=19506) ERROR 12-06 02:37:21 [multiproc_executor.py:772] {CAUSE}",
    "(EngineCore_DP0 pid=19490) WARNING 12-06 02:37:22 [core.py:12] shutting down",
]


class LogOnly(App[None]):
    def __init__(self, window: LogWindow) -> None:
        super().__init__()
        self.window = window

    def compose(self) -> ComposeResult:
        yield LogPane(self.window)


def _fed(lines: list[str]) -> tuple[LaunchMachine, LogWindow, list[int]]:
    """A live LaunchMachine fed `lines` as one chunk, the window the console would show, and
    each line's byte offset."""
    machine = LaunchMachine(noise=NoiseFilter(builtin_rules("vllm")))
    machine.started(1, 0.0, 0.0)
    window, pairs, offset = LogWindow(), [], 0
    for raw in lines:
        pairs.append((offset, raw))
        offset += len(raw) + 1
    for event in machine.feed_lines(pairs, 1.0):
        if isinstance(event, LinesAdded):
            window.append(entries(event.chunk))
    return machine, window, [at for at, _ in pairs]


def _window() -> tuple[LogWindow, int]:
    _, window, offsets = _fed(LINES)
    return window, offsets[4]


def _screen(view: LogView) -> list[str]:
    return ["".join(s.text for s in view.render_line(y)).rstrip()
            for y in range(view.size.height)]


def test_process_tags_are_short_and_say_which() -> None:
    assert [process_tag(p) for p in ("APIServer", "EngineCore_DP0", "EngineCore", "Worker_TP3",
                                     "Worker_DP1_TP2_EP6", "VllmWorker rank=2",
                                     "scheduler_DP0_TP3", None)] == [
        "API", "Core0", "Core", "TP3", "DP1TP2", "W2", "DP0TP3", ""]


async def test_the_log_is_compact_and_wraps_the_cause_where_raw_shows_it_as_written() -> None:
    window, cause_offset = _window()
    app = LogOnly(window)
    async with app.run_test(size=(80, 20)) as pilot:
        pane = app.query_one(LogPane)
        view = pane.view
        view.add(())  # draw what the window holds
        view.cause_offset = cause_offset
        view.refresh()
        await pilot.pause()
        screen = _screen(view)
        # compact: the time, the tag and the mark before each message; no prefix, no source
        assert screen[0] == "02:37:20 TP1    · world_size=8 rank=1"
        assert screen[1] == "02:37:21 TP1    ✖ WorkerProc failed to start."
        assert not any("pid=19506" in line or "multiproc_executor" in line for line in screen)
        assert any(line.startswith("02:37:22 Core0  ▲ shutting down") for line in screen)
        # the cause: marked, and wrapped under the message, never cut
        at = next(i for i, line in enumerate(screen) if CAUSE_MARK in line)
        wrapped = [screen[at]] + [line for line in screen[at + 1:at + 4]
                                  if line.startswith(" " * GUTTER)]
        assert len(wrapped) > 1
        assert " ".join(part.strip() for part in wrapped).endswith(CAUSE_MARK + CAUSE)
        assert all(len(line) <= 80 for line in screen)
        # raw: the line as written (one row, cut at the pane's edge)
        pane.toggle_raw()
        await pilot.pause()
        raw = _screen(view)
        assert raw[0].startswith("(Worker_TP1 pid=19506) INFO 12-06 02:37:20 "
                                 "[parallel_state.py:1208]")
        assert sum(CAUSE_MARK in line for line in raw) == 1


async def test_the_timeline_says_what_is_below_its_edge_at_160x45() -> None:
    sup = ReplaySupervisor(load_profile(PROFILE), serving_script())
    app = ConsoleApp(sup, clock=sup.pinned, env={}, profile_arg="kimi-k25-eagle3")
    async with app.run_test(size=(160, 45)) as pilot:
        pane = app.query_one("#pane-timeline")
        for _ in range(200):
            await pilot.pause(0.05)
            if pane.max_scroll_y > 0 and "more line" in str(pane.border_subtitle):
                break
        below = int(pane.max_scroll_y)
        assert below > 0, "the serving readout outgrows the pane at 45 rows"
        assert pane.border_subtitle == f"↓ {below} more lines"
        pane.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        assert pane.border_subtitle == ""
        # the processes pane keeps its rows beside it
        assert app.query_one("#pane-procs").size.height >= 8


# Two reports of a failure elsewhere, from the process that died: the diagnosis names the first
# and is not sure, so the live death carries a runner-up; the console marks both and `c` steps
# between them.
UNSURE = [
    "(EngineCore_DP0 pid=44606) ERROR 10-24 07:38:03 [core.py:718] ray.exceptions."
    "ActorDiedError: The actor died unexpectedly before finishing this task.",
    "(EngineCore_DP0 pid=44606) INFO 10-24 07:38:03 [core.py:720] retrying the placement",
    "(EngineCore_DP0 pid=44606) ERROR 10-24 07:38:04 [core.py:718] subprocess."
    "CalledProcessError: Command '['nvidia-smi']' returned non-zero exit status 255.",
]


async def test_an_unsure_cause_marks_its_runner_up_and_c_steps_between_them() -> None:
    machine, window, offsets = _fed(UNSURE)
    machine.feed_exit(ProcExit(44606, "EngineCore_DP0", 1, None, 2.0, False), 2.0)
    death = machine.death
    assert death is not None and death.cause is not None and death.runner_up is not None
    assert death.cause.offset == offsets[0] and death.runner_up.offset == offsets[2]
    app = LogOnly(window)
    async with app.run_test(size=(120, 20)) as pilot:
        pane = app.query_one(LogPane)
        pane.view.add(())
        pane.post_message(RootCauseFound(death.cause.offset, death.runner_up.offset))
        await pilot.pause()
        screen = _screen(pane.view)
        assert sum(CAUSE_MARK in line for line in screen) == 1
        assert sum(RUNNER_UP_MARK in line for line in screen) == 1
        assert pane.view.shown_offset == death.cause.offset
        assert pane.step_cause() and pane.view.shown_offset == death.runner_up.offset
        assert pane.step_cause() and pane.view.shown_offset == death.cause.offset
