"""RT throttling read from procfs, and the planning margin it imposes."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platforms import paths
from platforms.faketree import write_fake_tree
from platforms.rtbandwidth import MAX_MARGIN, parse_rt_share, planning_margin, rt_share
from platforms.spec import load_board
from platforms.sysfs import DirSysfs


@pytest.mark.parametrize(
    "runtime, period, share",
    [
        ("950000", "1000000", 0.95),  # the kernel's default
        ("-1", "1000000", 1.0),  # the cap lifted
        ("1000000", "1000000", 1.0),
        ("0", "1000000", 0.0),
        (" 800000\n", "1000000\n", 0.8),
    ],
)
def test_share_is_runtime_over_period(runtime, period, share):
    assert parse_rt_share(runtime, period) == pytest.approx(share)


@pytest.mark.parametrize(
    "runtime, period",
    [
        (None, "1000000"),
        ("950000", None),
        ("", "1000000"),
        ("lots", "1000000"),
        ("950000", "0"),
        ("-5", "1000000"),
        ("950000", "-1"),
    ],
)
def test_a_missing_or_malformed_value_is_unknown_not_a_cap(runtime, period):
    assert parse_rt_share(runtime, period) is None


def test_the_default_cap_does_not_outbid_the_default_slack():
    # 1 - 0.95 is 0.050000000000000044 in floats: it must not raise a configured 0.05
    assert planning_margin(0.05, parse_rt_share("950000", "1000000")) == 0.05


@pytest.mark.parametrize(
    "configured, share, margin",
    [
        (0.0, 0.95, 0.05),
        (0.0, 0.8, 0.2),
        (0.3, 0.8, 0.3),
        (0.0, 1.0, 0.0),
        (0.1, None, 0.1),
        (0.0, 0.0, MAX_MARGIN),
    ],
)
def test_planning_margin(configured, share, margin):
    assert planning_margin(configured, share) == pytest.approx(margin)


@given(st.floats(0.0, 0.99), st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_margin_never_below_the_configured_one_and_always_plannable(configured, share):
    m = planning_margin(configured, share)
    assert configured <= m < 1.0


def test_read_from_a_fake_tree_and_unknown_where_procfs_has_no_files(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    sysfs = DirSysfs(tmp_path)
    assert rt_share(sysfs) == pytest.approx(0.95)  # the fake tree holds the kernel's default
    (tmp_path / paths.RT_RUNTIME).write_text("-1\n")
    assert rt_share(sysfs) == 1.0
    (tmp_path / paths.RT_PERIOD).unlink()
    assert rt_share(sysfs) is None
