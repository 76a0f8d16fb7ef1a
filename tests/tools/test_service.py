"""The systemd unit and the install/uninstall plan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import service_plan as sp

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "hidvfs.service"
EXE = "/opt/hidvfs/venv/bin/hidvfs"


def unit_directives(text: str) -> dict[str, list[str]]:
    """section.key -> values (systemd allows a key several times)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def test_unit_has_the_service_contract():
    d = unit_directives(UNIT.read_text())
    one = {k: v[-1] for k, v in d.items()}
    assert one["Service.Type"] == "notify"
    assert one["Service.NotifyAccess"] == "main"
    assert one["Service.WatchdogSec"] == "10s"
    assert one["Service.Restart"] == "on-failure"
    assert one["Service.ExecStart"] == "/usr/bin/env hidvfs daemon --config /etc/hidvfs/config.yaml"
    assert {"nvpmodel.service", "nvpower.service"} <= set(one["Unit.After"].split())
    assert {"tuned.service", "power-profiles-daemon.service", "auto-cpufreq.service"} <= set(
        one["Unit.Conflicts"].split()
    )
    assert one["Service.StateDirectory"] == "hidvfs"
    assert one["Service.ConfigurationDirectory"] == "hidvfs"
    assert one["Service.RuntimeDirectory"] == "hidvfs"
    assert one["Service.ProtectSystem"] == "strict"
    assert "/sys/devices/system/cpu" in one["Service.ReadWritePaths"].split()
    # directives that would stop the daemon from doing its job
    for forbidden in (
        "ProtectKernelTunables",
        "RestrictRealtime",
        "ProtectKernelModules",
        "ExecStopPost",
    ):
        assert f"Service.{forbidden}" not in d, forbidden
    assert one["Install.WantedBy"] == "multi-user.target"


def test_render_unit_points_execstart_at_the_script():
    text = sp.render_unit(UNIT.read_text(), EXE)
    assert unit_directives(text)["Service.ExecStart"] == [
        f"{EXE} daemon --config /etc/hidvfs/config.yaml"
    ]
    quoted = sp.render_unit(UNIT.read_text(), "/opt/my tools/hidvfs")
    assert unit_directives(quoted)["Service.ExecStart"] == [
        '"/opt/my tools/hidvfs" daemon --config /etc/hidvfs/config.yaml'
    ]
    assert sp.render_unit(UNIT.read_text(), None) == UNIT.read_text()
    with pytest.raises(ValueError, match="absolute"):
        sp.render_unit(UNIT.read_text(), "hidvfs")


def test_install_plan_content():
    steps = sp.install_plan("/", EXE)
    actions = [(s.action, s.target or " ".join(s.argv)) for s in steps if s.action != "note"]
    assert actions == [
        ("write", "/etc/systemd/system/hidvfs.service"),
        ("mkdir", "/etc/hidvfs"),
        ("copy_if_absent", "/etc/hidvfs/config.yaml"),
        ("group", "groupadd --system hidvfs"),
        ("run", "systemctl daemon-reload"),
        ("run", "systemctl enable hidvfs.service"),
        # restart, not enable --now: a running daemon must pick up the new unit and code
        ("run", "systemctl restart hidvfs.service"),
    ]
    assert f"ExecStart={EXE} daemon" in steps[0].content
    assert Path(steps[2].source).read_text() == (ROOT / "systemd" / "config.yaml").read_text()


def test_uninstall_plan_content():
    steps = sp.uninstall_plan()
    actions = [(s.action, s.target or " ".join(s.argv)) for s in steps if s.action != "note"]
    assert actions == [
        ("stop", "systemctl disable --now hidvfs.service"),
        ("remove", "/etc/systemd/system/hidvfs.service"),
        ("run", "systemctl daemon-reload"),
    ]


def _runner(returns):
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        rc, out = returns.get(argv[1], (0, ""))
        return subprocess.CompletedProcess(argv, rc, stdout=out, stderr="")

    return run, calls


def test_uninstall_twice_is_fine_but_a_daemon_that_would_not_stop_keeps_its_unit(
    tmp_path, monkeypatch
):
    """A failed stop used to be ignored: the unit went while the daemon kept running."""
    monkeypatch.setattr(sp, "systemd_running", lambda: True)
    unit = tmp_path / "hidvfs.service"
    unit.write_text("x")
    steps = [s for s in sp.uninstall_plan() if s.action == "stop"] + [
        sp.Step("remove", "remove the systemd unit", str(unit))
    ]
    run, _ = _runner(
        {"disable": (5, "Unit hidvfs.service not loaded."), "is-active": (3, "inactive")}
    )
    sp.run_plan(steps, runner=run, out=lambda s: None)  # not installed / not running: fine
    assert not unit.exists()
    unit.write_text("x")
    run, _ = _runner({"disable": (1, "timeout"), "is-active": (0, "active\n")})
    with pytest.raises(sp.ServiceError, match="still running"):
        sp.run_plan(steps, runner=run, out=lambda s: None)
    assert unit.exists()


def test_a_staging_install_needs_no_root_and_takes_the_exe_given(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    steps = sp.install_plan(str(tmp_path), "/usr/local/bin/hidvfs")
    sp.run_plan(steps, runner=_never_run, out=lambda s: None)
    text = (tmp_path / "etc/systemd/system/hidvfs.service").read_text()
    assert "ExecStart=/usr/local/bin/hidvfs daemon" in text
    assert oct((tmp_path / "etc/hidvfs").stat().st_mode & 0o777) == "0o755"


def test_a_double_slash_prefix_is_the_live_system():
    assert sp.is_live("//") and sp.is_live("/./") and not sp.is_live("/tmp/x")
    assert any(s.action == "group" for s in sp.install_plan("//", EXE))


def test_a_percent_in_the_script_path_is_escaped_for_systemd():
    text = sp.render_unit(UNIT.read_text(), "/opt/pct%n/hidvfs")
    assert unit_directives(text)["Service.ExecStart"] == [
        "/opt/pct%%n/hidvfs daemon --config /etc/hidvfs/config.yaml"
    ]


def _never_run(*args, **kwargs):
    raise AssertionError(f"dry run executed {args}")


@pytest.mark.parametrize("systemd", [True, False])
def test_dry_run_prints_and_changes_nothing(capsys, monkeypatch, systemd):
    monkeypatch.setattr(sp, "systemd_running", lambda: systemd)
    sp.run_plan(sp.install_plan("/", EXE), dry_run=True, runner=_never_run)
    out = capsys.readouterr().out
    assert out.startswith("dry run: nothing is changed")
    # without systemd the plan printed in full, as if it would run, and then was refused
    assert ("note: systemd is not running here" in out) is not systemd
    assert "/etc/systemd/system/hidvfs.service" in out
    assert "groupadd --system hidvfs" in out
    assert "systemctl enable hidvfs.service" in out and "systemctl restart hidvfs.service" in out
    assert "systemctl daemon-reload" in out


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PermissionError, match="needs root: run it with sudo"):
        sp.run_plan(sp.install_plan("/", EXE), runner=_never_run)
    sp.run_plan(
        sp.install_plan("/", EXE), dry_run=True, runner=_never_run, out=lambda s: None
    )  # dry run is fine


def test_staging_install_writes_files_and_keeps_an_existing_config(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    steps = sp.install_plan(str(tmp_path), EXE)
    assert not any(s.action in ("run", "group") for s in steps)  # no systemctl on a staging tree
    sp.run_plan(steps, runner=_never_run, out=lambda s: None)
    unit = tmp_path / "etc/systemd/system/hidvfs.service"
    assert f"ExecStart={EXE} daemon" in unit.read_text()
    assert oct(unit.stat().st_mode & 0o777) == oct(0o644)
    cfg = tmp_path / "etc/hidvfs/config.yaml"
    assert cfg.read_text() == (ROOT / "systemd" / "config.yaml").read_text()
    cfg.write_text("period_ms: 20\n")  # the owner's edits survive a reinstall
    sp.run_plan(sp.install_plan(str(tmp_path), EXE), runner=_never_run, out=lambda s: None)
    assert cfg.read_text() == "period_ms: 20\n"
    sp.run_plan(sp.uninstall_plan(str(tmp_path)), runner=_never_run, out=lambda s: None)
    assert not unit.exists() and cfg.exists()


def test_a_reinstall_leaves_an_existing_config_folder_mode_alone(tmp_path, monkeypatch):
    """A re-run reset an owner's 0750 config folder to 0755."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    folder = tmp_path / "etc/hidvfs"
    folder.mkdir(parents=True)
    folder.chmod(0o750)
    lines: list[str] = []
    sp.run_plan(sp.install_plan(str(tmp_path), EXE), runner=_never_run, out=lines.append)
    assert oct(folder.stat().st_mode & 0o777) == oct(0o750)
    assert f"  kept the existing {folder} and its mode" in lines


def test_a_dangling_config_symlink_is_kept(tmp_path, monkeypatch):
    """A symlink to a config not there (yet) was replaced by the default config."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    cfg = tmp_path / "etc/hidvfs/config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.symlink_to(tmp_path / "elsewhere/config.yaml")
    lines: list[str] = []
    sp.run_plan(sp.install_plan(str(tmp_path), EXE), runner=_never_run, out=lines.append)
    assert cfg.is_symlink() and os.readlink(cfg) == str(tmp_path / "elsewhere/config.yaml")
    assert not (tmp_path / "elsewhere").exists()
    assert any(line.startswith(f"  kept the existing {cfg}") for line in lines)


def test_failing_command_stops_the_plan(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(sp, "systemd_running", lambda: True)
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        code = 1 if argv == ["false"] else 0
        return subprocess.CompletedProcess(argv, code, "", "Unit not found" if code else "")

    steps = [sp.Step("run", "first", argv=("false",)), sp.Step("run", "second", argv=("true",))]
    with pytest.raises(sp.ServiceError, match="Unit not found"):
        sp.run_plan(steps, runner=runner, out=lambda s: None)
    assert calls == [["false"]]
    tolerant = [
        sp.Step("run", "first", argv=("false",), may_fail=True),
        sp.Step("run", "second", argv=("true",)),
    ]
    sp.run_plan(tolerant, runner=runner, out=lambda s: None)
    assert calls[-1] == ["true"]


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "hidvfs.service"
    path.write_text(unit_text)
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's binary exists: point it at a real executable
    for allow_list in (True, False):
        text = sp.render_unit(UNIT.read_text(), sys.executable, allow_list)
        proc = _verify(text, tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "Unknown key" not in proc.stderr and "Unknown section" not in proc.stderr, (
            proc.stderr
        )
    # and the check can fail: a missing executable is reported
    bad = _verify(sp.render_unit(UNIT.read_text(), str(tmp_path / "missing-hidvfs")), tmp_path)
    assert bad.returncode != 0 and "missing-hidvfs" in bad.stderr


def test_a_script_under_a_home_folder_gets_protecthome_read_only(tmp_path, monkeypatch):
    """ProtectHome=yes hides /home and /root: a pyenv, --user or home venv install could not
    even be started (203/EXEC). Such a unit gets ProtectHome=read-only, others keep yes."""
    monkeypatch.setattr(sp, "_HOMES", (str(tmp_path) + "/",))
    script = tmp_path / "venv" / "bin" / "hidvfs"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/python3\n")
    text = sp.render_unit(UNIT.read_text(), str(script))
    assert unit_directives(text)["Service.ProtectHome"] == ["read-only"]
    # the interpreter of the script counts too (a system path script run by a home Python)
    other = tmp_path.parent / f"{tmp_path.name}-opt" / "hidvfs"
    other.parent.mkdir()
    other.write_text(f"#!{tmp_path}/venv/bin/python\n")
    assert unit_directives(sp.render_unit(UNIT.read_text(), str(other)))["Service.ProtectHome"] == [
        "read-only"
    ]
    assert unit_directives(sp.render_unit(UNIT.read_text(), EXE))["Service.ProtectHome"] == ["yes"]
    # the plan names the path that forced it (here the home Python, not the script)
    (step,) = [
        s
        for s in sp.install_plan(str(tmp_path / "stage"), str(other))
        if s.target.endswith(".service") and s.action == "write"
    ]
    assert f"ProtectHome=read-only: {tmp_path}/venv/bin/python is under a home folder" in (
        step.description
    )
    assert sp.home_path(EXE) is None


def test_an_editable_install_under_a_home_folder_gets_protecthome_read_only(monkeypatch):
    """The script may live in /usr/local/bin while the package is imported from ~/hidvfs."""
    import tools

    pkg = os.path.realpath(os.path.dirname(tools.__file__))
    monkeypatch.setattr(sp, "_HOMES", (os.path.dirname(pkg) + "/",))
    text = sp.render_unit(UNIT.read_text(), EXE)
    assert unit_directives(text)["Service.ProtectHome"] == ["read-only"]


# -- the system call allow-list only where systemd knows its group ------------------------------


def _filters(unit: str) -> list[str]:
    return unit_directives(unit).get("Service.SystemCallFilter", [])


def _probe(returncode=None, error=None):
    """A runner for knows_syscall_group: exits with ``returncode`` or raises ``error``."""
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        if error is not None:
            raise error
        return subprocess.CompletedProcess(argv, returncode, "", "")

    run.seen = seen
    return run


def test_the_probe_asks_systemd_analyze_and_any_doubt_means_unknown():
    known = _probe(0)
    assert sp.knows_syscall_group(runner=known) is True
    assert known.seen == [["systemd-analyze", "syscall-filter", "@system-service"]]
    # systemd-analyze says 'Filter set "@system-service" not found.' (or lacks the verb)
    assert sp.knows_syscall_group(runner=_probe(1)) is False
    assert (
        sp.knows_syscall_group(runner=_probe(error=FileNotFoundError("systemd-analyze"))) is False
    )
    timeout = subprocess.TimeoutExpired(["systemd-analyze"], 30)
    assert sp.knows_syscall_group(runner=_probe(error=timeout)) is False


def test_a_systemd_that_does_not_know_the_group_gets_the_unit_without_the_allow_list():
    """systemd 237 (Ubuntu 18.04, JetPack 4 on the TX2) ignores an unknown group and kills the
    service at start with SIGSYS: the installed unit must not carry it there."""
    old = sp.install_plan("/", EXE, knows_allow_list=lambda: False)
    unit = old[0].content
    assert _filters(unit) == [
        "~@mount @swap @reboot @module @clock @obsolete @cpu-emulation @raw-io"
    ]
    assert "without SystemCallFilter=@system-service" in old[0].description
    assert f"ExecStart={EXE} daemon" in unit
    new = sp.install_plan("/", EXE, knows_allow_list=lambda: True)
    assert _filters(new[0].content)[0] == "@system-service"
    assert "without" not in new[0].description
    # apart from the allow-list the two units are the same
    assert sp.without_allow_list(new[0].content) == unit


def test_a_staging_install_keeps_the_allow_list_and_says_what_an_old_target_needs(tmp_path):
    asked = []
    steps = sp.install_plan(str(tmp_path), EXE, knows_allow_list=lambda: asked.append(1) or False)
    assert asked == []  # this system's systemd says nothing about the target's
    assert _filters(steps[0].content)[0] == "@system-service"
    notes = " ".join(s.description for s in steps if s.action == "note")
    assert "237" in notes and "systemd-analyze syscall-filter @system-service" in notes


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_the_real_systemd_analyze_answers_the_probe():
    assert sp.knows_syscall_group("@system-service") is True
    assert sp.knows_syscall_group("@no-such-group") is False


def test_a_script_path_with_a_newline_is_refused_and_a_dollar_escaped():
    """A newline in --exe wrote a second directive into the unit; systemd expands $VAR in
    ExecStart, so a literal $ is written $$ (as % is written %%)."""
    with pytest.raises(ValueError, match="a unit file cannot hold"):
        sp.render_unit(UNIT.read_text(), "/opt/x\nExecStartPre=/bin/sh -c evil")
    text = sp.render_unit(UNIT.read_text(), "/opt/a$HOME/hidvfs")
    assert unit_directives(text)["Service.ExecStart"] == [
        '"/opt/a$$HOME/hidvfs" daemon --config /etc/hidvfs/config.yaml'
    ]


def test_a_live_install_without_systemd_changes_nothing(tmp_path, monkeypatch):
    """Without systemd running the unit, the config and the group were made, then
    `systemctl daemon-reload` failed half way, nothing rolled back."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert not sp.systemd_running(str(tmp_path / "no-such-dir"))
    assert sp.systemd_running(str(tmp_path))
    monkeypatch.setattr(sp, "systemd_running", lambda: False)
    with pytest.raises(sp.ServiceError, match="systemd is not running here .* nothing was changed"):
        sp.run_plan(sp.install_plan("/", EXE), runner=_never_run, out=_never_run)
    sp.run_plan(sp.install_plan(str(tmp_path), EXE), runner=_never_run, out=lambda s: None)
    assert (tmp_path / "etc/systemd/system/hidvfs.service").exists()  # staging needs no systemd


def test_an_empty_prefix_is_refused_not_the_working_directory():
    from click.testing import CliRunner

    from tools.cli import cli

    for cmd in ("install", "uninstall"):
        r = CliRunner().invoke(cli, ["service", cmd, "--dry-run", "--prefix", ""])
        assert r.exit_code == 2 and "Invalid value for '--prefix': empty" in r.output
