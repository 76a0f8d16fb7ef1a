"""DirSysfs maps every failure mode seen on the boards to one typed error naming the file."""

from __future__ import annotations

import errno
import os

import pytest

from platforms.errors import SysfsUnavailable, SysfsWriteError
from platforms.faketree import inject_read_error
from platforms.sysfs import DirSysfs

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def tree(tmp_path):
    def put(rel: str, text: str, mode: int = 0o644) -> str:
        full = tmp_path / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
        full.chmod(mode)
        return rel

    return DirSysfs(tmp_path), put


def test_read_strips_newline_and_nul(tree):
    s, put = tree
    put("a/value", "1234\n")
    put("proc/device-tree/model", "quill\x00")
    assert s.read("a/value") == "1234"
    assert s.read("/a/value") == "1234"  # a leading slash is still relative to the root
    assert s.read_int("a/value") == 1234
    assert s.read("proc/device-tree/model") == "quill"


def test_read_int_takes_leading_integer_of_a_unit_suffix(tree):
    s, put = tree
    put("rail", "32760 ma\n")
    assert s.read_int("rail") == 32760


def test_missing_file_names_the_file(tree):
    s, _ = tree
    with pytest.raises(SysfsUnavailable) as exc:
        s.read("class/thermal/thermal_zone9/temp")
    assert exc.value.path == "class/thermal/thermal_zone9/temp"
    assert "no such file" in str(exc.value)
    assert "class/thermal/thermal_zone9/temp" in str(exc.value)


@pytest.mark.parametrize("text", ["", "\n", "  \n", "\x00"])
def test_empty_value_is_unavailable_not_zero(tree, text):
    s, put = tree
    put("t", text)
    with pytest.raises(SysfsUnavailable, match="empty"):
        s.read("t")
    with pytest.raises(SysfsUnavailable):
        s.read_int("t")
    assert s.read_or("t") is None
    assert s.read_or("t", "x") == "x"


def test_unsupported_setspeed_is_unavailable(tree):
    s, put = tree
    put("devices/system/cpu/cpufreq/policy0/scaling_setspeed", "<unsupported>\n")
    with pytest.raises(SysfsUnavailable, match="<unsupported>"):
        s.read("devices/system/cpu/cpufreq/policy0/scaling_setspeed")


def test_a_byte_that_does_not_decode_is_read_leniently_but_never_exactly(tree, tmp_path):
    """Sensing takes the text with U+FFFD; a value to be written back must be refused."""
    s, put = tree
    gov = put("devices/system/cpu/cpufreq/policy0/scaling_governor", "")
    (tmp_path / gov).write_bytes(b"sched\xffutil\n")
    assert s.read(gov) == "sched\ufffdutil"
    with pytest.raises(SysfsUnavailable, match=r"scaling_governor: .*not valid UTF-8"):
        s.read_exact(gov)
    (tmp_path / gov).write_bytes(b"schedutil\n")
    assert s.read_exact(gov) == "schedutil"


def test_non_integer_names_the_text(tree):
    s, put = tree
    put("t", "hot\n")
    put("l", "1 2 x\n")
    with pytest.raises(SysfsUnavailable, match="not an integer: 'hot'"):
        s.read_int("t")
    with pytest.raises(SysfsUnavailable, match="not a list of integers"):
        s.read_ints("l")


def test_directory_is_unavailable(tree):
    s, put = tree
    put("zone/type", "x")
    with pytest.raises(SysfsUnavailable, match="is a directory"):
        s.read("zone")


@pytest.mark.parametrize(
    "err, name",
    [(errno.EAGAIN, "EAGAIN"), (errno.ENODATA, "ENODATA"), (errno.EIO, "EIO")],
)
def test_errno_on_read_is_unavailable_with_its_name(tree, monkeypatch, err, name):
    s, put = tree
    put("class/thermal/thermal_zone2/temp", "45000\n")
    inject_read_error(monkeypatch, s, "class/thermal/thermal_zone2/temp", err)
    with pytest.raises(SysfsUnavailable) as exc:
        s.read("class/thermal/thermal_zone2/temp")
    assert name in str(exc.value)
    assert exc.value.path == "class/thermal/thermal_zone2/temp"


def test_injection_touches_only_its_path(tree, monkeypatch):
    s, put = tree
    put("a", "1")
    put("b", "2")
    inject_read_error(monkeypatch, s, "a", errno.EAGAIN)
    assert s.read("b") == "2"
    with pytest.raises(SysfsUnavailable):
        s.read("a")
    monkeypatch.undo()
    assert s.read("a") == "1"


def test_nonblocking_read_returning_none_is_eagain(tree, monkeypatch):
    s, put = tree
    put("t", "1")
    inject_read_error(monkeypatch, s, "t", None)
    with pytest.raises(SysfsUnavailable, match="EAGAIN"):
        s.read("t")


def test_text_layer_typeerror_is_unavailable(tree, monkeypatch):
    """CPython < 3.14 can surface a failed read as TypeError (boards.md 1.2)."""
    s, put = tree
    put("t", "1")
    inject_read_error(monkeypatch, s, "t", TypeError("can't concat NoneType to bytes"))
    with pytest.raises(SysfsUnavailable, match="NoneType"):
        s.read("t")


def test_permission_denied_is_unavailable_injected(tree, monkeypatch):
    s, put = tree
    put("cpuinfo_cur_freq", "1")
    inject_read_error(monkeypatch, s, "cpuinfo_cur_freq", PermissionError(errno.EACCES, "denied"))
    with pytest.raises(SysfsUnavailable, match="permission denied"):
        s.read("cpuinfo_cur_freq")


@pytest.mark.skipif(IS_ROOT, reason="root bypasses file modes")
def test_permission_denied_for_real(tree):
    s, put = tree
    put("cpuinfo_cur_freq", "1", 0o000)
    with pytest.raises(SysfsUnavailable, match="permission denied"):
        s.read("cpuinfo_cur_freq")
    assert not s.writable("cpuinfo_cur_freq")


def test_write_replaces_value(tree):
    s, put = tree
    put("gov", "schedutil\n")
    s.write("gov", "userspace")
    assert s.read("gov") == "userspace"


def test_write_never_creates_a_missing_file(tree, tmp_path):
    s, _ = tree
    with pytest.raises(SysfsWriteError) as exc:
        s.write("devices/system/cpu/cpufreq/policy1/scaling_setspeed", "345600")
    e = exc.value
    assert e.errno == errno.ENOENT
    assert e.path == "devices/system/cpu/cpufreq/policy1/scaling_setspeed"
    assert e.value == "345600"
    text = str(e)
    assert "policy1/scaling_setspeed" in text and "'345600'" in text and "ENOENT" in text
    assert not (tmp_path / "devices").exists()


def test_write_to_directory_names_eisdir(tree):
    s, put = tree
    put("d/x", "1")
    with pytest.raises(SysfsWriteError, match="EISDIR"):
        s.write("d", "1")


def test_write_errno_from_kernel_is_reported(tree, monkeypatch):
    """A kernel refusal surfaces at os.write (EINVAL for a governor that is not loaded)."""
    s, put = tree
    put("gov", "schedutil")

    def refuse(fd, data):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "write", refuse)
    with pytest.raises(SysfsWriteError) as exc:
        s.write("gov", "powersave")
    assert exc.value.errno == errno.EINVAL
    assert (
        "EINVAL" in str(exc.value) and "'powersave'" in str(exc.value) and "gov" in str(exc.value)
    )


@pytest.mark.skipif(IS_ROOT, reason="root bypasses file modes")
def test_write_to_read_only_file_is_eacces(tree):
    s, put = tree
    put("scaling_cur_freq", "1", 0o444)
    assert not s.writable("scaling_cur_freq")
    with pytest.raises(SysfsWriteError, match="EACCES"):
        s.write("scaling_cur_freq", "2")


def test_list_and_exists(tree):
    s, put = tree
    put("class/thermal/thermal_zone1/type", "b")
    put("class/thermal/thermal_zone0/type", "a")
    assert s.list("class/thermal") == ["thermal_zone0", "thermal_zone1"]
    assert s.list("class/nothing") == []
    assert s.exists("class/thermal/thermal_zone0")
    assert not s.exists("class/thermal/thermal_zone7")
    assert s.writable("class/thermal/thermal_zone0/type")
    assert not s.writable("class/thermal/thermal_zone0/missing")
