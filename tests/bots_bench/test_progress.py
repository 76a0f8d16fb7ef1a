"""Campaign progress bar: quiet off a terminal and with --json, ETA from executed runs."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from bots_bench.progress import Progress, format_duration, render_line
from platforms.clock import VirtualClock


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_not_a_terminal_or_json():
    for stream, kw in (
        (io.StringIO(), {}),
        (FakeTTY(), {"json_mode": True}),
        (FakeTTY(), {"quiet": True}),
    ):
        with Progress(3, stream=stream, **kw) as bar:
            bar.start("fib/test")
            bar.done()
            bar.message("a failed run")
        assert stream.getvalue() == ""
        assert bar.done_count == 1  # still counts


def test_draws_on_a_terminal_with_eta():
    clock = VirtualClock()
    out = FakeTTY()
    with Progress(5, stream=out, clock=clock) as bar:
        assert bar.enabled
        bar.start("fib/test schedutil seed 0")
        assert bar.eta_s() is None  # nothing measured yet
        clock.sleep(10)
        bar.done()
        bar.start("fib/test hidvfs seed 0")
        clock.sleep(20)
        bar.done()
        assert bar.eta_s() == 45.0  # mean 15 s x 3 runs left
        bar.start("sort/test schedutil seed 0")
        clock.sleep(5)
        assert bar.eta_s() == 40.0  # the run in flight has used 5 s of its 15
    text = out.getvalue()
    assert "\r" in text and "2/5" in text and "sort/test schedutil seed 0" in text
    assert "ETA 45s" in text
    assert text.endswith("\n")


def test_skipped_runs_count_as_done_but_not_in_the_mean():
    clock = VirtualClock()
    bar = Progress(6, stream=FakeTTY(), clock=clock)
    bar.skip(3)
    bar.skip("fib/test hidvfs seed 1 rep 0")
    bar.start("x")
    clock.sleep(8)
    bar.done()
    assert bar.done_count == 5 and bar.executed == 1
    assert bar.eta_s() == 8.0
    bar.advance()  # the name the CLI uses
    assert bar.done_count == 6 and bar.eta_s() == 0.0


def test_format_duration():
    assert format_duration(None) == "--"
    assert format_duration(0.4) == "0s"
    assert format_duration(75) == "1m15s"
    assert format_duration(3 * 3600 + 125) == "3h02m"


@given(
    done=st.integers(0, 10_000),
    total=st.integers(0, 10_000),
    label=st.text(max_size=200),
    eta=st.one_of(st.none(), st.floats(0, 1e7)),
    width=st.integers(20, 300),
)
def test_render_line_fits(done, total, label, eta, width):
    line = render_line(done, total, label, eta, width)
    assert len(line) <= width
    assert f"{done}/{total}" in line
    if width >= 30:  # room for the counts and the longest ETA
        assert "ETA" in line
    assert "\n" not in line and "\r" not in line
    if width >= 60:
        assert line.startswith("[")
