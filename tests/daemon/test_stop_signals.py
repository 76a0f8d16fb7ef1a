"""Stop signals: a hangup ignored by ``nohup`` stays ignored (a dropped session must not end
hours of training or a campaign the user started with nohup)."""

from __future__ import annotations

import signal

from daemon.stopsignals import InterruptOnSignals, PassOnSignals, StopOnSignals


def test_an_ignored_hangup_stays_ignored_and_the_others_are_handled():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        for cls in (StopOnSignals, InterruptOnSignals):
            with cls():
                assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
                assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_hangup_not_ignored_stops():
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with StopOnSignals() as s:
            signal.raise_signal(signal.SIGHUP)
            assert s.stop.is_set() and s.received == "SIGHUP"
    finally:
        signal.signal(signal.SIGHUP, before)


def test_pass_on_keeps_every_ignored_signal_and_records_only_what_it_takes():
    """`hidvfs run` of a script's `cmd &` (SIGINT ignored, by its command too) must not turn
    a SIGINT into a stop; a signal its ``pass_on`` declines (a terminal's Ctrl-C, which the
    command got already) is not a stop either."""
    taken = []
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with PassOnSignals(lambda n: taken.append(n) or n == signal.SIGTERM) as s:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
            assert not s.stop.is_set() and s.received is None
            signal.raise_signal(signal.SIGTERM)
            assert s.received == "SIGTERM" and taken == [signal.SIGHUP, signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
