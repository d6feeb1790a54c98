"""Timeline pane: preflight's verdicts, then the phases in order with start and duration, the
current one as a bar with shard progress, the elapsed time and the ETA."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tui.console.messages import (
    HistoryShown,
    PreflightShown,
    RunChanged,
    ServingChanged,
    SpecDecodeChanged,
)
from tui.console.widgets.format import bar, sparkline
from tui.core.protocol import Check
from tui.core.status import RunView, timed_out_text, timeline_rows
from tui.core.units import duration


class TimelinePane(Widget, can_focus=True):
    """Drawn from the last RunChanged, the preflight verdict, the previous launch and the
    spec-decode readout; the app's clock tick keeps elapsed and ETA moving."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.view: RunView | None = None
        self.now = 0.0
        self.checks: tuple[Check, ...] = ()
        self.previous = ""
        self.spec: SpecDecodeChanged | None = None
        self.serving: ServingChanged | None = None

    def on_history_shown(self, message: HistoryShown) -> None:
        self.previous = message.text
        self.refresh(layout=True)

    def on_spec_decode_changed(self, message: SpecDecodeChanged) -> None:
        self.spec = message
        self.refresh(layout=True)

    def on_serving_changed(self, message: ServingChanged) -> None:
        self.serving = message
        self.refresh(layout=True)

    def on_run_changed(self, message: RunChanged) -> None:
        self.view, self.now = message.view, message.now
        self.refresh(layout=True)

    def on_preflight_shown(self, message: PreflightShown) -> None:
        self.checks = message.checks
        self.refresh(layout=True)

    def reset(self) -> None:
        """A new run: its preflight verdict (which came just before) stays."""
        self.view, self.spec, self.serving = None, None, None
        self.refresh(layout=True)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return len(self.render().split())

    def render(self) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        if self.previous:
            out.append(self.previous + "\n", style="dim")
        if self.checks:
            bad = [c for c in self.checks if not c.ok]
            out.append("preflight ", style="bold")
            out.append(f"{len(self.checks) - len(bad)}/{len(self.checks)} ok",
                       style="green" if not bad else "yellow")
            for check in bad:
                style = "bold red" if check.severity == "error" else "yellow"
                out.append(f"\n  {'✗' if check.severity == 'error' else '!'} {check.check}: "
                           f"{check.message}", style=style)
            out.append("\n")
        view, now = self.view, self.now
        if view is None or view.launched_at is None:
            out.append("not launched yet", style="dim")
            return out
        width = max(20, self.size.width)
        for row in timeline_rows(view, now):
            style = "bold red" if row.failed else ("bold" if row.current else "")
            out.append(f"{row.mark} ", style="red" if row.failed else
                       ("yellow" if row.current else "green"))
            out.append(f"{row.label:<22}", style=style)
            start = ("-" + duration(-row.start_s) if row.start_s < 0
                     else "+" + duration(row.start_s))  # a job's queue: before the launch
            out.append(f" {start:>8} {duration(row.duration_s):>7}")
            if row.detail:
                out.append(f" {row.detail}", style="" if row.current else "dim")
            if row.usual_s is not None:
                out.append(f" usually {duration(row.usual_s)}",
                           style="bold yellow" if row.slow else "dim")
            room = width - 42 - len(row.detail) - (16 if row.usual_s is not None else 0)
            if row.current and row.progress is not None and room >= 6:
                out.append(" ")
                out.append_text(bar(row.progress, room - 1, "yellow"))
            out.append("\n")
        if given_up := timed_out_text(view):
            out.append(given_up + "\n", style="bold yellow")
        out.append(f"elapsed {duration(view.elapsed(now))}", style="bold")
        if view.expected_load_s is not None:
            out.append(f" · expected {duration(view.expected_load_s)}")
        eta = view.eta(now)
        if eta is not None:
            out.append(f" · ETA ~{duration(eta)}" if eta > 0 else " · over the expected time",
                       style="cyan" if eta > 0 else "yellow")
        if self.serving is not None:
            out.append_text(serving_readout(self.serving, now))
        if self.spec is not None:
            out.append_text(spec_readout(self.spec, width))
        return out


def _rate(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value / 1000:.1f} k" if value >= 10_000 else f"{value:,.0f}"


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value * 100:.0f} %"


def serving_readout(serving: ServingChanged, now: float) -> Text:
    """Requests, throughput, KV cache and prefix cache now, each with its sparkline over the
    last minutes; where the figures come from and how old they are."""
    s, series = serving.latest, serving.series
    source = "/metrics" if s.source == "metrics" else "the stats line"
    out = Text("\nserving", style="bold")
    out.append(f"  from {source}, {duration(max(0.0, now - s.at))} ago", style="dim")

    def row(label: str, text: str, *names: str, top: float = 0.0) -> None:
        out.append(f"\n  {label:<11}")
        out.append(text, style="bold")
        trend = next((series[n] for n in names if len(series.get(n, ())) > 1), ())
        if trend:
            out.append("  ")
            scale = top or max(trend) or 1.0
            out.append(sparkline(tuple(int(v / scale * 1000) for v in trend), 1000, 20),
                       style="cyan")

    row("requests", f"{_rate(s.running)} running · {_rate(s.waiting)} waiting", "running")
    row("tokens/s", f"prompt {_rate(s.prompt_tps)} · generation {_rate(s.gen_tps)}", "gen_tps")
    row("KV cache", _share(s.kv_usage), "kv_usage", top=1.0)
    preempted = "" if s.preemptions is None else f" · preemptions {s.preemptions:,.0f}"
    row("prefix hit", _share(s.prefix_hit) + preempted, "prefix_hit", top=1.0)
    return out


def spec_readout(spec: SpecDecodeChanged, width: int) -> Text:
    """Acceptance rate and mean acceptance length with their trend, then acceptance per draft
    position as bars; the server's counters when /metrics gave them."""
    out = Text("\nspeculative decoding", style="bold")
    interval, totals = spec.interval, spec.totals
    if interval is not None:
        out.append(f"  acceptance {interval.acceptance_rate:.1f} %", style="bold cyan")
        out.append(f" · mean length {interval.mean_acceptance_length:.2f}")
        if len(spec.trend) > 1:
            out.append(" trend ")
            out.append(sparkline(tuple(int(r * 10) for r in spec.trend), 1000, 20),
                       style="cyan")
    per_position: tuple[float, ...] = interval.per_position if interval is not None else ()
    if not per_position and totals is not None and totals.drafts:
        per_position = tuple(a / totals.drafts for a in totals.accepted_per_position)
    bar_w = max(6, min(30, width - 16))
    for pos, rate in enumerate(per_position):
        out.append(f"\n  pos {pos} ")
        out.append_text(bar(rate, bar_w, "cyan"))
        out.append(f" {rate:.2f}")
    if totals is not None:
        out.append(f"\n  /metrics: {totals.drafts:,} drafts · {totals.draft_tokens:,} drafted · "
                   f"{totals.accepted_tokens:,} accepted", style="dim")
    return out
