"""Small text helpers shared by the panes: sizes, ages, bars, sparklines."""

from __future__ import annotations

from rich.text import Text

from tui.core.units import duration

SPARKS = "▁▂▃▄▅▆▇█"


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.1f}"


def size(n: int | None) -> str:
    """Bytes as M or G (binary), or an em dash when unknown: narrow table cells."""
    if n is None:
        return "—"
    if n >= 2**30:
        return f"{n / 2**30:.1f}G"
    return f"{n / 2**20:.0f}M"


def age(started: float | None, now: float) -> str:
    return "—" if started is None else duration(max(0.0, now - started))


def bar(fraction: float, width: int, style: str) -> Text:
    """A bar of `width` cells filled to `fraction` (eighths for the last cell) over a track."""
    fraction = min(1.0, max(0.0, fraction))
    full, part = divmod(round(fraction * width * 8), 8)
    filled = ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else ""))[:width]
    return Text.assemble((filled, f"{style} on grey23"), (" " * (width - len(filled)),
                                                          "on grey23"))


def sparkline(values: tuple[int, ...], top: int, width: int) -> str:
    """The last `width` values as block characters scaled to `top`."""
    if not values or width <= 0:
        return ""
    values = values[-width:]
    scale = top or max(values) or 1
    return "".join(SPARKS[min(7, int(v / scale * 7.999))] for v in values)
