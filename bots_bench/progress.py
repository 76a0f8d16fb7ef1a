"""A one-line campaign progress bar on stderr: the run in flight, done/total and an ETA.

It draws only on a terminal and never with ``--json`` (where stdout carries the result and
a human is not watching), so logs and pipes stay clean. The ETA is the mean duration of the
runs executed in this session times the runs left; runs skipped because they were already
stored count as done but not in the mean.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from platforms.clock import Clock, MonotonicClock


def format_duration(seconds: float | None) -> str:
    """``75`` -> ``1m15s``; ``None`` -> ``--``."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "--"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def render_line(done: int, total: int, label: str, eta_s: float | None, width: int = 80) -> str:
    """The bar as text, at most ``width`` characters.

    The counts and the ETA always show; the bar and then the label give way on a narrow
    terminal.
    """
    counts = f"{done}/{max(total, 0)}"
    tail = f"ETA {format_duration(eta_s)}"
    line = f"{counts} {tail}"
    if len(line) > width:
        return counts[:width]
    bar_w = 20 if width >= 60 else 10
    if len(line) + bar_w + 3 <= width:
        frac = 1.0 if total <= 0 else min(max(done / total, 0.0), 1.0)
        filled = int(round(frac * bar_w))
        counts = f"[{'#' * filled}{'.' * (bar_w - filled)}] {counts}"
        line = f"{counts} {tail}"
    room = width - len(line) - 2
    label = " ".join(label.split())  # one line, whatever the label holds
    if room >= 4 and label:
        lab = label if len(label) <= room else label[: room - 1] + "~"
        line = f"{counts}  {lab:<{room}}{tail}"
    return line


class Progress:
    """Progress of ``total`` runs; ``start(label)`` when a run begins, ``done()`` when it ends."""

    def __init__(
        self,
        total: int,
        *,
        json_mode: bool = False,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        clock: Clock | None = None,
        quiet: bool = False,
    ):
        self.total = total
        json_mode = json_mode or quiet
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled and not json_mode
        self.clock = clock if clock is not None else MonotonicClock()
        self.done_count = 0
        self.executed = 0
        self.label = ""
        self._busy_s = 0.0
        self._started_at: float | None = None
        self._drawn = False

    # -- accounting ---------------------------------------------------------------------
    def skip(self, what: int | str = 1) -> None:
        """Runs already in the store: done, but not part of the ETA mean.

        ``what`` is a count, or the label of the one run skipped.
        """
        if isinstance(what, str):
            self.label = f"skip {what}"
            what = 1
        self.done_count += what
        self._draw()

    def start(self, label: str) -> None:
        self.label = label
        self._started_at = self.clock.now()
        self._draw()

    def done(self) -> None:
        if self._started_at is not None:
            self._busy_s += max(self.clock.now() - self._started_at, 0.0)
            self.executed += 1
            self._started_at = None
        self.done_count += 1
        self._draw()

    advance = done

    def eta_s(self) -> float | None:
        if self.executed == 0:
            return None
        left = max(self.total - self.done_count, 0)
        eta = self._busy_s / self.executed * left
        if self._started_at is not None:  # the run in flight has already used some time
            eta -= min(self.clock.now() - self._started_at, self._busy_s / self.executed)
        return max(eta, 0.0)

    # -- drawing ------------------------------------------------------------------------
    def line(self) -> str:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        return render_line(self.done_count, self.total, self.label, self.eta_s(), width)

    def _draw(self) -> None:
        if not self.enabled:
            return
        self.stream.write("\r\x1b[2K" + self.line())
        self.stream.flush()
        self._drawn = True

    def message(self, text: str) -> None:
        """Print a line above the bar (a failed run, a warning) and redraw the bar."""
        if not self.enabled:
            return
        self.stream.write("\r\x1b[2K" + text + "\n")
        self._draw()

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
