"""The atomic writer on a stream (/dev/null, a FIFO): written as it is, never renamed over,
and never waited on (the daemon writes its status file from the control loop)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from platforms.atomicfile import write_text_atomic


def test_a_fifo_without_a_reader_is_an_error_at_once_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "status.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(OSError):
        write_text_atomic(fifo, '{"t": 1}\n')
    assert time.monotonic() - t0 < 5  # a blocking open waited for a reader for ever
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["status.fifo"]


def test_a_fifo_with_a_reader_gets_the_text(tmp_path):
    fifo = tmp_path / "status.fifo"
    os.mkfifo(fifo)
    got = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader holds it open
    try:
        write_text_atomic(fifo, '{"t": 1}\n')
        got.append(os.read(fd, 100))
    finally:
        os.close(fd)
    assert got == [b'{"t": 1}\n'] and fifo.is_fifo()


def test_a_full_fifo_is_an_error_not_a_wait(tmp_path):
    fifo = tmp_path / "status.fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    try:
        done = threading.Event()

        def fill():
            try:
                for _ in range(200):
                    write_text_atomic(fifo, "x" * 4096)
            except OSError:
                pass
            done.set()

        threading.Thread(target=fill, daemon=True).start()
        assert done.wait(10), "a write to a full FIFO waited for its reader"
    finally:
        os.close(fd)
