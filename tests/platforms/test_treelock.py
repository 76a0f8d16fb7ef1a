"""One controller per board: the lock on the tree's cpufreq folder."""

import os
import re
import subprocess
import sys

import pytest

from platforms import treelock
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.treelock import TreeBusy, TreeLock


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path)
    first = TreeLock(DirSysfs(tmp_path)).acquire()
    # held by this process (pytest), which is no hidvfs command: named by its pid only
    held = f"another hidvfs process is controlling {tmp_path} (pid {os.getpid()})"
    with pytest.raises(TreeBusy, match=re.escape(held)):
        TreeLock(DirSysfs(tmp_path)).acquire()
    first.release()
    with TreeLock(DirSysfs(tmp_path)):  # free again
        pass


def test_trees_are_locked_apart_and_a_tree_without_cpufreq_takes_no_lock(tmp_path):
    for name in ("a", "b"):
        write_fake_tree(load_board("tx2"), tmp_path / name)
    (tmp_path / "empty").mkdir()
    with TreeLock(DirSysfs(tmp_path / "a")), TreeLock(DirSysfs(tmp_path / "b")):
        with TreeLock(DirSysfs(tmp_path / "empty")), TreeLock(DirSysfs(tmp_path / "empty")):
            pass


#: a holder of the tree's lock whose command line is as hidvfs's console script gives it
#: (``python3 /usr/bin/hidvfs bots run ...``): it takes the lock, says so, waits for stdin
_HOLDER = """import sys
from platforms.sysfs import DirSysfs
from platforms.treelock import TreeLock
TreeLock(DirSysfs(sys.argv[-1])).acquire()
print("held", flush=True)
sys.stdin.read()
"""


def _refusal_while_held(tmp_path, script: str, *args: str) -> tuple[str, int]:
    """TreeBusy's message while ``python tmp_path/script args... TREE`` holds the lock, and
    the holder's pid."""
    tree = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), tree)
    (tmp_path / script).write_text(_HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / script), *args, str(tree)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "held\n"
        with pytest.raises(TreeBusy) as err:
            TreeLock(DirSysfs(tree)).acquire()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    return str(err.value), proc.pid


@pytest.mark.parametrize(
    "args, who, advice",
    [
        (
            ("bots", "run", "--backend", "native"),
            "a native BOTS campaign",
            "wait for it to finish or stop it first (kill {pid}: its finished runs are kept",
        ),
        (("bots", "profile", "--bots-bin", "bin"), "a BOTS profile measurement", "(kill {pid})"),
        (("profile", "measure", "--name", "fib.small"), "a profile measurement", "(kill {pid})"),
        (("daemon", "--config", "c.yaml"), "another hidvfs daemon", "(sudo systemctl stop hidvfs)"),
    ],
)
def test_a_refusal_names_what_holds_the_board_and_what_to_do(tmp_path, args, who, advice):
    """A native campaign or a profile measurement holds the board as a daemon does; a
    refusal that blamed a daemon sent the user to systemctl while a campaign ran."""
    message, pid = _refusal_while_held(tmp_path, "hidvfs", *args)
    command = " ".join(a for a in args[:2] if not a.startswith("-"))
    assert message.startswith(
        f"{who} is controlling {tmp_path / 'tree'} (pid {pid}, hidvfs {command}); "
    )
    assert advice.format(pid=pid) in message
    assert ("systemctl" in message) == (args[0] == "daemon")


def test_a_holder_that_cannot_be_told_is_not_called_a_daemon(tmp_path, monkeypatch):
    message, pid = _refusal_while_held(tmp_path, "holder.py", "bots", "run")
    assert message.startswith(
        f"another hidvfs process is controlling {tmp_path / 'tree'} (pid {pid}); "
    )
    assert "a daemon: sudo systemctl stop hidvfs" in message
    monkeypatch.setattr(treelock, "PROC_LOCKS", str(tmp_path / "no-proc-locks"))
    message, _ = _refusal_while_held(tmp_path, "hidvfs", "daemon")
    assert message.startswith(
        f"another hidvfs process is controlling {tmp_path / 'tree'} (a daemon, a native BOTS "
        "campaign or a profile measurement); "
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["/usr/bin/python3", "/usr/local/bin/hidvfs", "bots", "run", "--spec", "c.yaml"],
            ("bots", "run"),
        ),
        (["python", "-m", "tools.cli", "daemon", "--sysfs-root", "t"], ("daemon",)),
        (
            ["/usr/bin/python3", "-u", "/usr/bin/hidvfs", "bots", "study", "vs-geardvfs"],
            ("bots", "study"),
        ),
        (["hidvfs", "profile", "measure"], ("profile", "measure")),
        (["hidvfs", "bots", "list"], None),
        (["python", "-m", "pytest", "daemon"], None),
        (["python", "holder.py", "daemon"], None),
    ],
)
def test_the_holder_is_told_from_its_command_line(argv, words):
    assert treelock.command_words(argv) == words
