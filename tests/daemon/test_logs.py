"""journald-friendly key=value logging."""

from __future__ import annotations

import io
import json
import logging
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.logs import format_value, log_event, setup_logging


@pytest.fixture
def capture():
    stream = io.StringIO()
    logger = setup_logging(
        "debug", "keyvalue", stream=stream, journal=False, logger_name="hidvfs.test"
    )
    yield logger, stream
    logger.handlers.clear()


def test_event_first_then_fields_one_line(capture):
    logger, stream = capture
    log_event(
        logger,
        "tick",
        policy="hidvfs",
        freq_khz=1420800,
        temp_c=51.25,
        ok=True,
        err=None,
        detail="two words",
    )
    (line,) = stream.getvalue().splitlines()
    tokens = shlex.split(line)
    assert tokens[0] == "event=tick"
    kv = dict(t.split("=", 1) for t in tokens)
    assert kv["policy"] == "hidvfs" and kv["freq_khz"] == "1420800" and kv["temp_c"] == "51.25"
    assert kv["ok"] == "true" and kv["err"] == "null" and kv["detail"] == "two words"
    assert kv["level"] == "info" and kv["logger"] == "hidvfs.test" and "ts" in kv


def test_journal_mode_prefixes_the_priority_and_drops_the_time():
    stream = io.StringIO()
    logger = setup_logging("info", stream=stream, journal=True, logger_name="hidvfs.jtest")
    log_event(logger, "restore_failed", logging.ERROR, path="policy0/scaling_max_freq")
    log_event(logger, "drift", logging.WARNING, n=2)
    logger.debug("hidden")  # below the level
    lines = stream.getvalue().splitlines()
    assert (
        lines[0].startswith("<3>event=restore_failed ")
        and "ts=" not in lines[0]
        and "level=" not in lines[0]
    )
    assert lines[1].startswith("<4>event=drift ")
    assert len(lines) == 2
    logger.handlers.clear()


def test_plain_messages_and_preformatted_events(capture):
    logger, stream = capture
    logger.info("event=job_done pid=%d name=%s", 12, "fft")
    logger.warning("something odd happened")
    a, b = stream.getvalue().splitlines()
    assert a.startswith("event=job_done level=info ") and "pid=12 name=fft" in a
    assert b.startswith("event=log level=warning ") and 'msg="something odd happened"' in b


def test_tracebacks_stay_on_one_line(capture):
    logger, stream = capture
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        logger.exception("event=crash")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "exc=" in lines[0] and "RuntimeError" in lines[0] and "\\n" in lines[0]


def test_json_format():
    stream = io.StringIO()
    logger = setup_logging("info", "json", stream=stream, logger_name="hidvfs.json")
    log_event(logger, "tick", freq_khz=960000, cpus=[0, 3])
    obj = json.loads(stream.getvalue())
    assert (
        list(obj)[0] == "event"
        and obj["event"] == "tick"
        and obj["freq_khz"] == 960000
        and obj["cpus"] == [0, 3]
    )
    logger.handlers.clear()


def test_json_under_the_journal_prefixes_the_priority_and_drops_the_time():
    """``logging.format: json`` under systemd: ``journalctl -p err`` must find its errors, so
    each object gets the ``<N>`` prefix of its level, and no ``ts`` (the journal stamps it)."""
    stream = io.StringIO()
    logger = setup_logging("info", "json", stream=stream, journal=True, logger_name="hidvfs.jj")
    log_event(logger, "restore_failed", logging.ERROR, path="policy0/scaling_max_freq")
    log_event(logger, "drift", logging.WARNING, n=2)
    logger.info("plain\nmessage")
    logger.debug("hidden")  # below the level
    lines = stream.getvalue().splitlines()
    assert [line[:3] for line in lines] == ["<3>", "<4>", "<6>"]
    objs = [json.loads(line[3:]) for line in lines]
    assert all("ts" not in o for o in objs), lines
    assert objs[0] == {
        "event": "restore_failed",
        "path": "policy0/scaling_max_freq",
        "level": "error",  # kept: the journal strips the prefix from the message it stores
        "logger": "hidvfs.jj",
    }
    assert objs[2]["msg"] == "plain\nmessage"
    logger.handlers.clear()
    # on a terminal (or a file): no prefix, and the time is in the object
    stream = io.StringIO()
    logger = setup_logging("info", "json", stream=stream, journal=False, logger_name="hidvfs.jj")
    log_event(logger, "restore_failed", logging.ERROR)
    line = stream.getvalue().strip()
    assert line.startswith("{") and "ts" in json.loads(line)
    logger.handlers.clear()


def test_setup_is_idempotent_and_validates():
    s1, s2 = io.StringIO(), io.StringIO()
    setup_logging("info", stream=s1, logger_name="hidvfs.idem")
    logger = setup_logging("info", stream=s2, logger_name="hidvfs.idem")
    log_event(logger, "once")
    assert s1.getvalue() == "" and s2.getvalue().count("event=once") == 1
    with pytest.raises(ValueError, match="log level"):
        setup_logging("loud")
    with pytest.raises(ValueError, match="log format"):
        setup_logging("info", "xml")
    logger.handlers.clear()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (0.5, "0.5"),
        ("a b", '"a b"'),
        ("", '""'),
        ('q"x', '"q\\"x"'),
        ((0, 3), "0,3"),
        ("k=v", '"k=v"'),
        (1e-9, "1e-09"),
    ],
)
def test_format_value(value, text):
    assert format_value(value) == text


@given(st.text(max_size=40).filter(str.isprintable))
def test_printable_values_survive_a_shell_style_split(value):
    rendered = f"k={format_value(value)}"
    assert shlex.split(rendered) == [f"k={value}"]


@given(st.text(max_size=40))
def test_any_value_stays_on_one_line(value):
    rendered = format_value(value)
    assert rendered.isprintable()  # no newline or other control character can split the line
    assert " " not in rendered or (rendered.startswith('"') and rendered.endswith('"'))


def test_control_characters_are_escaped():
    assert format_value("a\x01b\u2028c\U000e0001") == '"a\\x01b\\u2028c\\U000e0001"'
