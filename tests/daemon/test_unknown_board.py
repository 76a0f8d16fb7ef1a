"""A board hidvfs ships no agents for (probed): a learned policy is refused before anything is
written, with what to run instead; a governor policy runs and gives the board back."""

from __future__ import annotations

import pytest

from daemon.service import DaemonError, run_live
from platforms.faketree import write_fake_tree
from platforms.spec import load_board


@pytest.fixture
def rock5b(tmp_path):
    """A RUBIK Pi 3's tree under another board's device-tree names: nothing detects it."""
    tree = tmp_path / "tree"
    write_fake_tree(load_board("rubikpi3"), tree)
    (tree / "proc/device-tree/model").write_bytes(b"Radxa ROCK 5B\0")
    (tree / "proc/device-tree/compatible").write_bytes(b"radxa,rock-5b\0rockchip,rk3588\0")
    return tree


def _governors(tree):
    return sorted(
        (p.parent.name, p.read_text().strip())
        for p in tree.glob("**/cpufreq/policy*/scaling_governor")
    )


@pytest.mark.parametrize("policy", ["hidvfs", "ztt", "geardvfs"])
def test_a_learned_policy_on_a_probed_board_is_refused_with_what_to_run(rock5b, tmp_path, policy):
    before = _governors(rock5b)
    state = tmp_path / "state"
    with pytest.raises(DaemonError) as err:
        run_live(
            sysfs_root=str(rock5b),
            policy=policy,
            state_dir=str(state),
            duration_s=0.2,
            socket_path=str(state / "s.sock"),
        )
    text = str(err.value)
    assert f"policy {policy!r}" in text and "Radxa ROCK 5B" in text
    assert "--policy schedutil" in text and "tx2" in text
    # no "run `hidvfs agents train`": it cannot train for a board without plant parameters
    assert "`hidvfs agents train`" not in text
    assert _governors(rock5b) == before and not state.exists()  # refused before any write


def test_a_governor_policy_runs_on_a_probed_board_and_restores_it(rock5b, tmp_path):
    before = _governors(rock5b)
    state = tmp_path / "state"
    status = run_live(
        sysfs_root=str(rock5b),
        policy="schedutil",
        period_ms=20,
        state_dir=str(state),
        duration_s=0.3,
        socket_path=str(state / "s.sock"),
    )
    assert status["ticks"] > 3 and status["board"] == "unknown"
    assert _governors(rock5b) == before and not (state / "restore.json").exists()


def test_service_install_on_a_board_without_agents_installs_a_governor_config(tmp_path):
    """The shipped config's `policy: hidvfs` would fail every start there (and systemd's
    restarts with it): the installed config says schedutil and why, the rest as shipped."""
    import yaml

    from tools import service_plan as sp

    why = "this board is not one hidvfs ships agents for (probed: Radxa ROCK 5B)"
    steps = sp.install_plan("/", "/usr/bin/hidvfs", agents_missing=lambda: why)
    config = next(s for s in steps if s.action == "copy_if_absent")
    shipped = yaml.safe_load((sp.source_dir() / "config.yaml").read_text())
    installed = yaml.safe_load(config.content)
    assert installed == {**shipped, "policy": "schedutil"} and shipped["policy"] == "hidvfs"
    assert why in config.content and why in config.describe()
    assert any(s.action == "note" and "refuses to start" in s.description for s in steps)
    # written as planned where no config exists; an existing one is kept
    target = tmp_path / "config.yaml"
    sp._execute(sp.Step("copy_if_absent", "c", str(target), content=config.content), print, None)
    assert yaml.safe_load(target.read_text())["policy"] == "schedutil"
    target.write_text("policy: maxfreq\n")
    sp._execute(sp.Step("copy_if_absent", "c", str(target), content=config.content), print, None)
    assert target.read_text() == "policy: maxfreq\n"
    # a board with agents, or a staging tree, gets the config as shipped
    for steps in (
        sp.install_plan("/", "/usr/bin/hidvfs", agents_missing=lambda: None),
        sp.install_plan(str(tmp_path / "stage"), "/usr/bin/hidvfs", agents_missing=lambda: why),
    ):
        config = next(s for s in steps if s.action == "copy_if_absent")
        assert config.content is None and not any("ships agents" in s.describe() for s in steps)


def test_the_board_without_agents_is_told_from_the_tree(rock5b, tmp_path):
    from tools.service_plan import board_without_agents

    assert "Radxa ROCK 5B" in board_without_agents(str(rock5b))
    shipped = tmp_path / "shipped"
    write_fake_tree(load_board("tx2"), shipped)
    assert board_without_agents(str(shipped)) is None
    assert board_without_agents(str(tmp_path / "empty")) is None  # no cpufreq: the daemon says
