"""One controller per board: the lock on the tree's cpufreq folder."""

import pytest

from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from platforms.sysfs import DirSysfs
from platforms.treelock import TreeBusy, TreeLock


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path)
    first = TreeLock(DirSysfs(tmp_path)).acquire()
    with pytest.raises(TreeBusy, match=f"another hidvfs daemon is controlling {tmp_path}"):
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
