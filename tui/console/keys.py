"""The console's keys, declared once as data: bindings, the footer, help and the palette."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True, slots=True)
class Key:
    id: str
    key: str
    action: str
    description: str
    help: str
    show: bool = True
    display: str | None = None


KEYS: tuple[Key, ...] = (  # the footer shows them in this order: the vital ones first
    Key("quit", "q", "quit_console", "Quit",
        "Leave the console; the server keeps running (the demo stops its own)"),
    Key("help", "question_mark", "help", "Help", "These keys", display="?"),
    Key("open", "enter", "open_member", "Open",
        "Fleet: open the selected host's panes (GPUs, processes, logs, timeline, banner)",
        display="⏎"),
    Key("fleet", "escape", "show_fleet", "Fleet",
        "Back to the fleet: a row per run and per host (with several runs or hosts)",
        display="Esc"),
    Key("kill", "k", "kill", "Kill",
        "TERM the run's process group, KILL after the grace, sweep by run id, verify (in the "
        "fleet: the selected run, on every one of its hosts)"),
    Key("restart", "r", "restart", "Restart",
        "Kill this run (after you confirm), check nothing is left, launch a new run (in the "
        "fleet: the selected run)"),
    Key("kill-leftovers", "K", "kill_leftovers", "Kill leftovers",
        "Shown when preflight refused because leftovers of ended runs hold the GPUs: kill "
        "exactly those (after you confirm), check they are gone, then launch", display="K"),
    Key("stacks", "d", "stacks", "Stacks",
        "Dump the Python stacks of every process of the run with py-spy on the GPU host (where "
        "each is stuck, the engine's frames marked); saved in the run's directory too"),
    Key("cause", "c", "next_cause", "Cause",
        "Show the root cause's line in the log (▶ ROOT CAUSE); when the diagnosis was not sure, "
        "step between it and the runner-up (▷ RUNNER-UP)", show=False),
    Key("raw", "f", "toggle_raw", "Raw/filtered",
        "Show every line, or hide the noise rules' lines (counted in the log header)"),
    Key("search", "slash", "search", "Search", "Search the log by regular expression",
        display="/"),
    Key("next-match", "n", "next_match", "Next", "Next search match", show=False),
    Key("prev-match", "N", "prev_match", "Previous", "Previous search match", show=False),
    Key("follow", "space", "toggle_follow", "Follow/pause",
        "Follow new log lines, or hold the view where it is"),
    Key("next-pane", "tab", "next_pane", "Next pane",
        "Move to the next pane (on a small terminal: show it)"),
    Key("prev-pane", "shift+tab", "prev_pane", "Previous pane", "Move to the previous pane",
        show=False),
)


def bindings() -> list[Binding]:
    return [Binding(k.key, k.action, k.description, show=k.show, key_display=k.display,
                    tooltip=k.help, id=k.id, priority=k.id in ("next-pane", "prev-pane"))
            for k in KEYS]
