"""The atomic writer on a stream (/dev/null, a FIFO): written as it is, never renamed over;
waited on as a shell's `>` is, but for the daemon's status file (written from its control
loop), which is not; and a stream only when it is this user's or root's to write."""

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
        write_text_atomic(fifo, '{"t": 1}\n', stream_nonblocking=True)
    assert time.monotonic() - t0 < 5  # a blocking open waited for a reader for ever
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["status.fifo"]


def test_a_fifo_with_a_reader_gets_the_text(tmp_path):
    fifo = tmp_path / "status.fifo"
    os.mkfifo(fifo)
    got = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader holds it open
    try:
        write_text_atomic(fifo, '{"t": 1}\n', stream_nonblocking=True)
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
                    write_text_atomic(fifo, "x" * 4096, stream_nonblocking=True)
            except OSError:
                pass
            done.set()

        threading.Thread(target=fill, daemon=True).start()
        assert done.wait(10), "a write to a full FIFO waited for its reader"
    finally:
        os.close(fd)


def test_a_pipe_gets_every_byte_by_default(tmp_path):
    """Every stream write was non-blocking: `--status-file /dev/stdout | slow reader` lost the
    rest past 64 KiB with "write could not complete without blocking"."""
    import subprocess
    import sys

    code = (
        "from platforms.atomicfile import write_bytes_atomic\n"
        "write_bytes_atomic('/dev/stdout', b'x' * 300_000)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    time.sleep(0.5)  # the pipe fills while nobody reads
    out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0 and len(out) == 300_000


def test_a_name_under_a_planted_link_to_proc_is_not_a_stream(tmp_path):
    """A link to /proc/self made `DIR/p/comm` look like a stream (its folder resolved into
    /proc), and the writer wrote the status into the process's own comm."""
    (tmp_path / "p").symlink_to("/proc/self")
    before = open("/proc/self/comm").read()
    with pytest.raises(OSError):  # renamed over: no temporary can be made in /proc
        write_text_atomic(tmp_path / "p" / "comm", '{"t": 1}\n')
    assert open("/proc/self/comm").read() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a FIFO to another user")
def test_another_users_fifo_in_a_shared_folder_is_replaced_not_written(tmp_path):
    """Root wrote its status into a FIFO another user made in /tmp and read."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    fifo = shared / "d.json"
    os.mkfifo(fifo)
    os.chown(fifo, 65534, 65534)
    write_text_atomic(fifo, '{"t": 1}\n')  # would wait for a reader if written as a stream
    assert fifo.is_file() and not fifo.is_symlink() and fifo.read_text() == '{"t": 1}\n'


def test_own_fifo_and_dev_stdout_are_streams(tmp_path):
    from platforms.atomicfile import written_as_stream

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    assert written_as_stream(str(fifo)) and written_as_stream("/dev/stdout")
    assert written_as_stream("/dev/null") and written_as_stream("/dev/fd/1")
    assert not written_as_stream(str(tmp_path)) and not written_as_stream(str(tmp_path / "x"))
