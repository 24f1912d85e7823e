"""Plain progress lines (what a log file or CI shows): when they come, what they say, the interval setting."""

import io

import pytest

from kvroute.errors import ConfigError
from kvroute.progress import INTERVAL_ENV, PlainProgress, interval_from_env


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def lines(stream):
    return stream.getvalue().splitlines()


def test_a_line_at_every_step_of_the_total_with_count_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    with PlainProgress(out, interval=1e9, step=0.25, unit="cells", clock=clock).task("sweep", total=40) as t:
        for _ in range(40):
            clock.t += 0.5  # 2 cells/s
            t.advance()
    got = lines(out)
    assert got[0] == "sweep: started, 40 to do"
    assert got[1:5] == ["sweep: 10/40 (25%), 2.00 cells/s, elapsed 0:05, ETA 0:15",
                        "sweep: 20/40 (50%), 2.00 cells/s, elapsed 0:10, ETA 0:10",
                        "sweep: 30/40 (75%), 2.00 cells/s, elapsed 0:15, ETA 0:05",
                        "sweep: 40/40 (100%), 2.00 cells/s, elapsed 0:20"]
    assert got[5:] == ["sweep: done in 0:20, 40/40"]


def test_a_line_after_interval_seconds_without_a_step_and_none_before():
    clock, out = Clock(), io.StringIO()
    with PlainProgress(out, interval=30, step=0.5, clock=clock).task("tickets", total=1000) as t:
        clock.t += 29
        t.advance(3)
        assert len(lines(out)) == 1  # only "started": under the interval and under a step
        clock.t += 1
        t.advance(3)
        assert lines(out)[-1] == "tickets: 6/1000 (1%), 0.20/s, elapsed 0:30, ETA 1:22:50"
        clock.t += 29.5
        assert t.tick() == pytest.approx(0.5)  # the ticker's wait until the next line is due
        clock.t += 0.5
        t.tick()  # no work for an interval: the ticker still prints
        assert lines(out)[-1] == "tickets: 6/1000 (1%), 0.10/s, elapsed 1:00, ETA 2:45:40"


def test_work_found_done_moves_the_count_but_not_the_rate():
    clock, out = Clock(), io.StringIO()
    with PlainProgress(out, interval=0, unit="cells", clock=clock).task("sweep", total=100) as t:
        t.update(completed=90)  # a resumed sweep: 90 cells already in the store
        clock.t += 10
        t.advance(2)
    assert lines(out)[:3] == ["sweep: started, 100 to do", "sweep: 90/100 already done, 10 to do",
                              "sweep: 92/100 (92%), 0.20 cells/s, elapsed 0:10, ETA 0:40"]


def test_slow_rates_per_minute_large_counts_shortened_and_indeterminate_stages():
    clock, out = Clock(), io.StringIO()
    p = PlainProgress(out, interval=0, clock=clock)
    with p.task("assembling", total=400e6) as t:
        clock.t += 2
        t.advance(100e6)
    assert lines(out)[1] == "assembling: 100.0M/400.0M (25%), 50.0M/s, elapsed 0:02, ETA 0:06"
    with p.task("prefill", total=10) as t:
        clock.t += 120
        t.advance()
    assert lines(out)[-2] == "prefill: 1/10 (10%), 0.50/min, elapsed 2:00, ETA 18:00"
    with p.task("loading model", total=None) as t:
        clock.t += 3725
        t.tick()
    assert lines(out)[-3:] == ["loading model: started", "loading model: elapsed 1:02:05",
                               "loading model: done in 1:02:05"]


def test_a_stage_that_raises_says_where_it_stopped():
    clock, out = Clock(), io.StringIO()
    with pytest.raises(KeyboardInterrupt), PlainProgress(out, interval=1e9, clock=clock).task("sweep", total=10) as t:
        t.advance(3)
        raise KeyboardInterrupt
    assert lines(out)[-1].startswith("sweep: 3/10 (30%)") and lines(out)[-1].endswith("(stopped)")


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert interval_from_env() == 30.0
    monkeypatch.setenv(INTERVAL_ENV, "2.5")
    assert interval_from_env() == 2.5
    assert PlainProgress(io.StringIO()).interval == 2.5
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv(INTERVAL_ENV, bad)
        with pytest.raises(ConfigError, match=INTERVAL_ENV):
            interval_from_env()
