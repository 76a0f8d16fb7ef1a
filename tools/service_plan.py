"""What ``hidvfs service install|uninstall`` does, as an explicit list of steps.

The plan is computed first and then either printed (``--dry-run``) or executed, so what the user
reviews is exactly what runs. With a ``prefix`` other than ``/`` (a staging tree for packaging)
only files are written; the systemctl and groupadd steps need the live system.
"""

from __future__ import annotations

import grp
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from platforms.atomicfile import write_text_atomic

UNIT_NAME = "hidvfs.service"
GROUP = "hidvfs"
CONFIG_PATH = "/etc/hidvfs/config.yaml"
UNIT_DIR = "/etc/systemd/system"
DAEMON_ARGS = f"daemon --config {CONFIG_PATH}"
#: Conflicts= of the unit: starting hidvfs stops these
RIVALS = ("auto-cpufreq.service", "power-profiles-daemon.service", "tuned.service")


@dataclass(frozen=True)
class Step:
    """One action. ``action`` is write | copy_if_absent | mkdir | remove | group | run | note."""

    action: str
    description: str
    target: str = ""
    argv: tuple[str, ...] = ()
    content: str | None = None
    source: str | None = None
    mode: int = 0o644
    #: a failing command does not stop the plan (e.g. disabling a unit that is not installed)
    may_fail: bool = False

    def describe(self) -> str:
        if self.action in ("run", "stop"):
            return f"{self.description}: {shlex.join(self.argv)}"
        if self.target:
            return f"{self.description}: {self.target}"
        return self.description


class ServiceError(Exception):
    """A step failed (names the step and the cause)."""


def source_dir() -> Path:
    """Folder holding the shipped ``hidvfs.service`` and ``config.yaml``.

    The installed package carries them as ``tools/systemd/``; a source checkout has them in
    the top-level ``systemd/``.
    """
    here = Path(__file__).resolve().parent
    for cand in (here / "systemd", here.parent / "systemd"):
        if (cand / UNIT_NAME).is_file() and (cand / "config.yaml").is_file():
            return cand
    raise ServiceError(
        f"cannot find {UNIT_NAME} and config.yaml next to {here} (broken installation?)"
    )


def default_exe() -> str | None:
    """Absolute path of the installed ``hidvfs`` script, None when it is not on PATH."""
    found = shutil.which("hidvfs")
    return os.path.abspath(found) if found else None


def _systemd_quote(arg: str) -> str:
    arg = arg.replace("%", "%%")  # a specifier to systemd otherwise
    arg = arg.replace("$", "$$")  # an environment variable to systemd otherwise
    if arg and all(c.isalnum() or c in "/._-+:@%" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


#: the unit's system call allow-list group; systemd 237 (Ubuntu 18.04, so JetPack 4 on the
#: TX2) does not know it, ignores it and kills the service at start with SIGSYS
ALLOW_LIST_GROUP = "@system-service"
_ALLOW_LIST_LINE = f"SystemCallFilter={ALLOW_LIST_GROUP}"


def knows_syscall_group(
    group: str = ALLOW_LIST_GROUP,
    runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> bool:
    """Whether this system's systemd knows the system call group (``systemd-analyze
    syscall-filter GROUP`` succeeds). False when it cannot tell either (no systemd-analyze,
    or one too old for the verb): a missing allow-list costs hardening, an unknown one the
    service."""
    try:
        proc = runner(
            ["systemd-analyze", "syscall-filter", group],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def without_allow_list(unit: str) -> str:
    """The unit without its ``SystemCallFilter=@system-service`` allow-list (the deny-list of
    older groups stays), with a comment saying why."""
    lines = unit.splitlines(keepends=True)
    return "".join(
        f"# {_ALLOW_LIST_LINE} left out: this systemd does not know {ALLOW_LIST_GROUP}, and an\n"
        "# allow-list it cannot read kills the daemon at start (SIGSYS)\n"
        if ln.strip() == _ALLOW_LIST_LINE
        else ln
        for ln in lines
    )


_FIND = object()  # render_unit's ``home``: look it up from ``exe``


def render_unit(
    template: str, exe: str | None, allow_list: bool = True, home: str | None | object = _FIND
) -> str:
    """The unit with ExecStart pointing at ``exe`` (unchanged ``/usr/bin/env hidvfs`` if None);
    ``allow_list=False``: without the system call allow-list (see :func:`without_allow_list`);
    ``home``: what :func:`home_path` says of ``exe``, when the caller has it already."""
    if not allow_list:
        template = without_allow_list(template)
    if exe is None:
        return template
    if not os.path.isabs(exe):
        raise ValueError(f"ExecStart needs an absolute path to the hidvfs script, got {exe!r}")
    if not exe.isprintable():
        # a newline would end the ExecStart line and start another directive
        raise ValueError(
            f"the hidvfs script path {exe!r} has a newline or another unprintable character, "
            "which a unit file cannot hold; install it under a plain path"
        )
    lines = template.splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if ln.startswith("ExecStart=")]
    if len(hits) != 1:
        raise ValueError(
            f"the unit template must have exactly one ExecStart= line, found {len(hits)}"
        )
    lines[hits[0]] = f"ExecStart={_systemd_quote(exe)} {DAEMON_ARGS}\n"
    if home is _FIND:
        home = home_path(exe)
    if home:
        # ProtectHome=yes hides /home and /root, and the service could not even start the
        # script (203/EXEC); read-only keeps them unwritable but lets it run
        lines = [
            f"# hidvfs runs from {home}, under a home folder ProtectHome=yes would hide\n"
            "ProtectHome=read-only\n"
            if ln.strip() == "ProtectHome=yes"
            else ln
            for ln in lines
        ]
    return "".join(lines)


_HOMES = ("/home/", "/root/", "/run/user/")


def home_path(exe: str) -> str | None:
    """The first of the script, the Python it runs under (also where their links lead) and
    the package's folder that lives where ProtectHome=yes hides; None when none does."""
    import tools

    # the package too: an editable install under a home folder runs code from there
    paths = [exe, os.path.realpath(exe), os.path.realpath(os.path.dirname(tools.__file__)) + "/"]
    try:
        with open(exe, "rb") as f:
            first = f.readline(512)
        if first.startswith(b"#!"):
            interp = first[2:].decode(errors="replace").split()
            if interp:
                paths += [interp[0], os.path.realpath(interp[0])]
    except OSError:
        pass
    return next((p for p in paths if p.startswith(_HOMES)), None)


def is_live(prefix: str) -> bool:
    """The prefix is the running system's root (``//`` and ``/./`` are ``/`` too)."""
    return os.path.realpath(prefix) == "/"


def _under(prefix: str, path: str) -> str:
    return os.path.join(os.path.abspath(prefix), path.lstrip("/"))


#: the policy the default config gets on a board without shipped agents
FALLBACK_POLICY = "schedutil"


def board_without_agents(root: str = "/") -> str | None:
    """This machine's board when hidvfs ships no learned agents for it ("this board is not
    one hidvfs ships agents for (probed: MODEL)"); None when it does, or when the tree has no
    cpufreq policy (the daemon refuses to start there and says why)."""
    from agents.learned import boards_with_agents
    from platforms import cpufreq
    from platforms.probe import detect_board, read_model
    from platforms.sysfs import DirSysfs

    sysfs = DirSysfs(root)
    try:
        if not cpufreq.list_policies(sysfs):
            return None
        name = detect_board(sysfs)
        model = read_model(sysfs)
    except OSError:
        return None
    if name and name in boards_with_agents():
        return None
    what = f"probed: {model}" if model else "probed"
    return f"this board is not one hidvfs ships agents for ({name or what})"


def governor_config(text: str, why: str) -> str:
    """The shipped config with its ``policy:`` line set to :data:`FALLBACK_POLICY`, saying
    why in a comment (every other line as shipped)."""
    out, n = re.subn(
        r"(?m)^policy: *\S+ *$",
        f"# {why}: the learned policies cannot run here\npolicy: {FALLBACK_POLICY}",
        text,
        count=1,
    )
    if n != 1:
        raise ValueError("the shipped config.yaml has no top-level 'policy:' line")
    return out


def install_plan(
    prefix: str = "/",
    exe: str | None = None,
    src: Path | None = None,
    knows_allow_list: Callable[[], bool] = knows_syscall_group,
    agents_missing: Callable[[], str | None] = board_without_agents,
) -> list[Step]:
    """Steps of ``hidvfs service install``: unit, default config (kept if present), group,
    daemon-reload, enable --now. On the live system the unit keeps its system call
    allow-list only where systemd knows its group (``knows_allow_list``); a staging tree's
    unit keeps it (the target's systemd is not known here). On a live board hidvfs ships no
    agents for (``agents_missing``), the default config runs ``schedutil``: its
    ``policy: hidvfs`` would fail every start."""
    src = src or source_dir()
    exe = exe if exe is not None else default_exe()
    live = is_live(prefix)
    allow_list = knows_allow_list() if live else True
    no_agents = agents_missing() if live else None
    home = home_path(exe) if exe else None  # reads the script: once, for the unit and the plan
    unit = render_unit((src / UNIT_NAME).read_text(encoding="utf-8"), exe, allow_list, home)
    steps = [
        Step(
            "write",
            f"install the systemd unit (ExecStart={exe or '/usr/bin/env hidvfs'}"
            + (f", ProtectHome=read-only: {home} is under a home folder" if home else "")
            + (
                ""
                if allow_list
                else f", without {_ALLOW_LIST_LINE}: this systemd does not know the group"
            )
            + ")",
            _under(prefix, f"{UNIT_DIR}/{UNIT_NAME}"),
            content=unit,
        ),
        Step(
            "mkdir",
            "create the config folder",
            _under(prefix, os.path.dirname(CONFIG_PATH)),
            mode=0o755,
        ),
        Step(
            "copy_if_absent",
            "install the default config unless one exists"
            + (f" (with policy: {FALLBACK_POLICY}: {no_agents})" if no_agents else ""),
            _under(prefix, CONFIG_PATH),
            source=str(src / "config.yaml"),
            content=(
                governor_config((src / "config.yaml").read_text(encoding="utf-8"), no_agents)
                if no_agents
                else None
            ),
        ),
    ]
    if no_agents:
        steps.append(
            Step(
                "note",
                f"{no_agents}: the learned policies (hidvfs, geardvfs, ztt) cannot run here; an "
                f"existing config naming one must say policy: {FALLBACK_POLICY}, or the daemon "
                "refuses to start",
            )
        )
    if live:
        steps += [
            Step(
                "group",
                f"create the system group {GROUP} for registry clients unless it exists (groupadd --system {GROUP})",
                argv=("groupadd", "--system", GROUP),
            ),
            Step("run", "reload systemd", argv=("systemctl", "daemon-reload")),
            Step("run", "enable the daemon at boot", argv=("systemctl", "enable", UNIT_NAME)),
            # restart, not start: a daemon already running must pick up the new unit and code
            Step(
                "run",
                "(re)start the daemon",
                argv=("systemctl", "restart", UNIT_NAME),
            ),
            Step(
                "note",
                f"starting hidvfs stops {', '.join(RIVALS)} (Conflicts=); they write the same cpufreq files",
            ),
            Step(
                "note",
                f"let a user register jobs: sudo usermod -aG {GROUP} USER (then log in again)",
            ),
        ]
    else:
        steps.append(
            Step(
                "note",
                f"staging prefix {prefix}: group, daemon-reload and enable are left to the target system",
            )
        )
        steps.append(
            Step(
                "note",
                f"the unit keeps {_ALLOW_LIST_LINE}: a target whose systemd does not know it "
                "(237 on Ubuntu 18.04 / JetPack 4; check with systemd-analyze syscall-filter "
                f"{ALLOW_LIST_GROUP}) needs that line removed, or the daemon is killed at start",
            )
        )
    return steps


def uninstall_plan(prefix: str = "/") -> list[Step]:
    """Steps of ``hidvfs service uninstall``. Stopping the daemon restores the original cpufreq
    settings; the config, the state folder and the group are kept."""
    live = is_live(prefix)
    steps: list[Step] = []
    if live:
        steps.append(
            Step(
                "stop",
                "stop (restoring the original cpufreq settings) and disable the daemon",
                argv=("systemctl", "disable", "--now", UNIT_NAME),
            )
        )
    steps.append(
        Step("remove", "remove the systemd unit", _under(prefix, f"{UNIT_DIR}/{UNIT_NAME}"))
    )
    if live:
        steps.append(Step("run", "reload systemd", argv=("systemctl", "daemon-reload")))
    steps.append(
        Step(
            "note",
            f"kept {CONFIG_PATH}, /var/lib/hidvfs and the group {GROUP}; remove them by hand if wanted",
        )
    )
    return steps


def _write_atomic(path: str, content: str, mode: int) -> None:
    write_text_atomic(path, content, mode=mode)


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def systemd_running(run_dir: str = "/run/systemd/system") -> bool:
    """sd_booted(3): systemd is the init system when this folder exists."""
    return os.path.isdir(run_dir)


def run_plan(
    steps: list[Step],
    dry_run: bool = False,
    out: Callable[[str], None] = print,
    runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> None:
    """Print (``dry_run``) or execute ``steps`` in order; stop at the first failing step."""
    # a staging tree only gets files: whoever can write it may install there
    live = any(s.action in ("run", "group", "stop") for s in steps)
    if dry_run:
        out("dry run: nothing is changed; the plan is:")
        for i, s in enumerate(steps, 1):
            out(f"  {i}. {s.describe()}")
        if live and not systemd_running():  # the plan is still worth reading; say so
            out(
                "note: systemd is not running here (no /run/systemd/system): the plan itself "
                "would be refused on this machine; --prefix DIR stages the files for another"
            )
        return
    if os.geteuid() != 0 and live:
        raise PermissionError(
            "installing or removing the hidvfs service needs root: run it with sudo (or add --dry-run to see the plan)"
        )
    if live and not systemd_running():
        # the unit, the config and the group would be made, then systemctl would fail half way
        raise ServiceError(
            "systemd is not running here (no /run/systemd/system): nothing was changed; "
            "install with --prefix DIR to stage the files for another machine"
        )
    for s in steps:
        if s.action == "note":
            out(f"note: {s.description}")
            continue
        out(s.describe())
        try:
            _execute(s, out, runner)
        except (OSError, subprocess.SubprocessError) as err:
            raise ServiceError(f"step failed: {s.describe()}: {err}") from None


def _execute(
    s: Step, out: Callable[[str], None], runner: Callable[..., subprocess.CompletedProcess]
) -> None:
    if s.action == "write":
        _write_atomic(s.target, s.content or "", s.mode)
    elif s.action == "mkdir":
        if os.path.isdir(s.target):  # its owner may have narrowed it: a re-run keeps that
            out(f"  kept the existing {s.target} and its mode")
            return
        os.makedirs(s.target, mode=s.mode, exist_ok=True)
        os.chmod(s.target, s.mode)  # the umask must not narrow it
    elif s.action == "copy_if_absent":
        if os.path.lexists(s.target):  # a symlink, even dangling, is the owner's choice
            dangling = os.path.islink(s.target) and not os.path.exists(s.target)
            note = f" (a symlink to {os.readlink(s.target)}, not there yet)" if dangling else ""
            out(f"  kept the existing {s.target}{note}")
            return
        if s.content is not None:
            _write_atomic(s.target, s.content, s.mode)
            return
        with open(s.source or "", encoding="utf-8") as f:
            _write_atomic(s.target, f.read(), s.mode)
    elif s.action == "remove":
        try:
            os.unlink(s.target)
        except FileNotFoundError:
            out(f"  {s.target} was not installed")
    elif s.action == "stop":
        proc = runner(list(s.argv), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            active = runner(
                ["systemctl", "is-active", UNIT_NAME], capture_output=True, text=True, check=False
            )
            if (active.stdout or "").strip() in ("active", "activating", "deactivating"):
                detail = (proc.stderr or proc.stdout or "").strip()
                raise subprocess.SubprocessError(
                    f"the daemon is still running and the unit stays ({detail})"
                )
            out(f"  not running ({(proc.stderr or proc.stdout or '').strip()})")
    elif s.action in ("run", "group"):
        if s.action == "group" and _group_exists(GROUP):
            out(f"  group {GROUP} already exists")
            return
        proc = runner(list(s.argv), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout or "").strip()
            if s.may_fail:
                out(f"  ignored: exit status {proc.returncode} {detail}")
                return
            raise subprocess.SubprocessError(f"exit status {proc.returncode}: {detail}")
    else:
        raise ValueError(f"unknown step action {s.action!r}")
