"""Durations and sizes as a person reads them, the same everywhere (console, `wait`, history).

Pure formatting of a number with its unit; what a run's events mean in words is describe.py.
"""

from __future__ import annotations


def duration(seconds: float) -> str:
    """12m04s, 1h02m, 9.5s: compact, readable at a glance."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def size_words(n: int) -> str:
    """Bytes as a person reads them: 512 KiB, 3.2 MiB, 1.0 GiB."""
    return (f"{n >> 10} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB" if n < 2**30
            else f"{n / 2**30:.1f} GiB")
