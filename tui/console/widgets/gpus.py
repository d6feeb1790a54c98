"""GPUs pane: one row per device: memory bar with numbers, utilisation, memory since launch,
the pid holding it; a device that stopped growing while its peers grow is marked."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tui.console.messages import GpusChanged
from tui.console.widgets.format import bar, gib, sparkline
from tui.core.gpuview import GpuRow

# Columns every row spends besides the name, the bar and the sparkline: the index, the gap
# after the name, the numbers ("  0.0/140.4G "), the utilisation (" 40%").
ROW_FIXED = 2 + 1 + 15 + 4
MIN_BAR = 8  # the bar keeps this much before the name is cut
MIN_NAME = 10


def holder_words(holder: int | None) -> str:
    return f" pid {holder}" if holder is not None else " —"


def row_columns(rows: tuple[GpuRow, ...], names: list[str], width: int) -> tuple[int, int, int]:
    """(name, bar, sparkline) widths for `width` columns: what the rows really hold at their
    right (holders, marks) is counted, the name is shown whole while the bar keeps MIN_BAR,
    and what is left is shared by the bar (3/5) and the sparkline."""
    tail = max(len(holder_words(r.holder)) for r in rows) + (7 if any(r.lagging for r in rows)
                                                             else 0)
    room = width - ROW_FIXED - tail
    name_w = min(max(map(len, names)), max(MIN_NAME, room - MIN_BAR))
    spare = max(MIN_BAR, room - name_w)
    bar_w = max(6, spare * 3 // 5) if spare >= MIN_BAR + 4 else spare
    return name_w, bar_w, max(0, spare - bar_w - 1)


class GpuPane(Widget, can_focus=True):
    """Rows drawn from the last GpusChanged; nothing is sampled here."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.rows: tuple[GpuRow, ...] = ()
        self.note: str | None = None

    def on_gpus_changed(self, message: GpusChanged) -> None:
        self.rows, self.note = message.rows, message.note
        self.refresh(layout=True)

    def reset(self) -> None:
        self.rows, self.note = (), None
        self.refresh(layout=True)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return max(1, len(self.rows))

    def render(self) -> Text:
        if not self.rows:
            return Text(self.note or "no GPU data yet", style="yellow" if self.note else "dim")
        names = [r.info.name.removeprefix("NVIDIA ") for r in self.rows]
        name_w, bar_w, spark_w = row_columns(self.rows, names, self.size.width)
        out = Text(no_wrap=True, overflow="crop")
        for i, row in enumerate(self.rows):
            gpu = row.info
            used, total = gpu.mem_used, gpu.mem_total
            frac = (used or 0) / total if total else 0.0
            style = "bold yellow" if row.lagging else ("red" if frac > 0.95 else "green")
            out.append(f"{gpu.index} ", style="bold")
            out.append(f"{names[i][:name_w]:<{name_w}} ")
            if gpu.lost:
                out.append("LOST — fell off the bus (NVML: GPU is lost)", style="bold red")
                if i < len(self.rows) - 1:
                    out.append("\n")
                continue
            out.append_text(bar(frac, bar_w, style))
            out.append(f"  {gib(used):>5}/{gib(total):>5}G ")
            out.append(f"{gpu.util:>3}%" if gpu.util is not None else "  —%", style="cyan")
            if spark_w:
                out.append(" " + sparkline(row.history, total or 0, spark_w), style="blue")
            out.append(holder_words(row.holder), style="dim")
            if row.lagging:
                out.append(" ⚠ flat", style="bold yellow")
            if i < len(self.rows) - 1:
                out.append("\n")
        return out
