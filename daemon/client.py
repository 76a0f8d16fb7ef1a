"""Client of the daemon's job-registry socket (used by ``hidvfs run`` and ``hidvfs status``).

One connection per request, one JSON line each way. When the daemon cannot be reached the
error says where it looked, why it failed and what to check, instead of a bare errno.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from daemon.config import DEFAULT_SOCKET
from daemon.jobs import JobExit
from daemon.stopsignals import PassOnSignals
from platforms.clock import MonotonicClock
from platforms.errors import HidvfsError
from platforms.liveprocs import adopt_orphans, adopts_orphans, spawn

#: status answers list every job, so allow more than a request line
MAX_ANSWER = 16 * 1024 * 1024
#: seconds a command told to stop (a signal passed on, a refused registration) has to end
#: before it and what it started are SIGKILLed
STOP_GRACE_S = 5.0


class DaemonUnreachable(HidvfsError):
    """The registry socket is missing, refuses connections, or does not answer."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(
            f"cannot reach the hidvfs daemon at {path}: {reason}; is it running? (systemctl status hidvfs)"
        )


class DaemonBusy(DaemonUnreachable):
    """The daemon's socket exists but its queue of connections stayed full for the whole
    timeout (a burst of clients, or a daemon that stopped accepting)."""

    def __init__(self, path: str, timeout: float):
        self.path = path
        self.reason = f"its connection queue stayed full for {timeout:g} s"
        HidvfsError.__init__(
            self,
            f"the hidvfs daemon at {path} is busy: {self.reason} (too many clients at once, "
            "or the daemon is stuck: systemctl status hidvfs); try again",
        )


class NotASocket(DaemonUnreachable):
    """The path is there but is a file or a folder: a wrong ``--socket``, not a daemon that
    stopped ("is it running?" would send the user the wrong way)."""

    def __init__(self, path: str, what: str):
        self.path = path
        self.reason = f"{path} is not a socket but {what}"
        HidvfsError.__init__(
            self,
            f"{self.reason}: --socket names the daemon's Unix socket ({DEFAULT_SOCKET} by default)",
        )


class NotAllowed(DaemonUnreachable):
    """The socket refused this user (EACCES): the daemon may well be running, but its socket
    is for root and its group only ("is it running?" would send the user the wrong way)."""

    def __init__(self, path: str):
        self.path = path
        where, advice = _socket_access(path)
        self.reason = f"permission denied: this user may not use its socket ({where})"
        HidvfsError.__init__(
            self,
            f"this user is not allowed to use the hidvfs daemon's socket {path} "
            f"({where}): {advice}",
        )


def _socket_access(path: str) -> tuple[str, str]:
    """Who the socket at ``path`` lets in (``mode 0660, owner root, group hidvfs``) and what
    this user can do about it: join the socket's group, or (a socket of its owner's only, a
    folder closed to this user) run as that owner."""
    import grp
    import pwd

    def names(st: os.stat_result) -> tuple[str, str]:
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = str(st.st_gid)
        return owner, group

    def join(group: str) -> str:
        return f"join the {group!r} group (sudo usermod -aG {group} $USER, then log in again)"

    try:
        st = os.stat(path)
    except OSError:  # the folder cannot be entered: who may, is the folder's to say
        folder = os.path.dirname(os.path.abspath(path))
        try:
            fst = os.stat(folder)
        except OSError:
            return f"its folder {folder} is closed to this user", "run as its owner or root"
        owner, group = names(fst)
        fmode = stat.S_IMODE(fst.st_mode)
        where = f"its folder {folder} is closed to this user: mode {fmode:04o}, owner {owner}, group {group}"
        if fmode & 0o010:
            return where, join(group)
        return where, f"only {owner} may enter it: run as {owner}"
    owner, group = names(st)
    mode = stat.S_IMODE(st.st_mode)
    where = f"mode {mode:04o}, owner {owner}, group {group}"
    if not mode & 0o020:
        return where, (
            f"only {owner} may use it (the daemon's socket.group is unset, or that group is "
            f"missing): run as {owner}"
        )
    return where, join(group)


def _not_a_socket(path: str) -> str | None:
    """ "a file" / "a folder" when ``path`` exists and is not a socket, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    return "a folder" if stat.S_ISDIR(mode) else "a file"


class RegistryError(HidvfsError):
    """The daemon answered ``{"ok": false, "error": ...}``."""

    def __init__(self, op: str, error: str):
        self.op = op
        self.error = error
        super().__init__(f"hidvfs daemon refused {op}: {error}")


class UnreadableStatus(HidvfsError):
    """The daemon answered a status of a shape this client does not know (another version)."""

    def __init__(self, path: str, what: str):
        super().__init__(
            f"the daemon at {path} answered a status this hidvfs cannot read ({what}); "
            "is it another hidvfs version?"
        )


class RegistryClient:
    def __init__(self, path: str = DEFAULT_SOCKET, timeout: float = 5.0):
        self.path = path
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"RegistryClient({self.path!r})"

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request; return the answer when ``ok``, raise RegistryError otherwise."""
        answer = self._roundtrip((json.dumps(req) + "\n").encode())
        if not isinstance(answer, dict) or "ok" not in answer:
            raise DaemonUnreachable(self.path, f"unexpected answer {answer!r:.200}")
        if not answer["ok"]:
            raise RegistryError(str(req.get("op")), str(answer.get("error", "no reason given")))
        return answer

    def _connect(self) -> socket.socket:
        """A socket connected to the daemon within ``timeout`` seconds.

        A socket with a timeout is non-blocking, and a non-blocking connect to a Unix socket
        whose accept queue is full fails at once with EAGAIN (it does not wait as TCP does):
        under a burst of clients that used to fail the request ("Resource temporarily
        unavailable") and ``hidvfs run`` killed the command it had launched. EAGAIN is
        retried, with a short growing pause, until the timeout."""
        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
                return sock
            except BlockingIOError:  # EAGAIN: the daemon's accept queue is full just now
                sock.close()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DaemonBusy(self.path, self.timeout) from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.05)
            except BaseException:
                sock.close()
                raise

    def _roundtrip(self, line: bytes) -> Any:
        sock = None
        try:
            try:
                sock = self._connect()
            except FileNotFoundError:
                raise DaemonUnreachable(self.path, "no such socket") from None
            except ConnectionRefusedError:
                what = _not_a_socket(self.path)
                if what is not None:  # a wrong --socket, not a stopped daemon
                    raise NotASocket(self.path, what) from None
                raise DaemonUnreachable(
                    self.path, "connection refused (a stale socket of a stopped daemon?)"
                ) from None
            except PermissionError:  # a daemon this user may not use, not a stopped one
                raise NotAllowed(self.path) from None
            except TimeoutError:
                raise DaemonUnreachable(self.path, f"no answer within {self.timeout:g} s") from None
            except OSError as err:
                raise DaemonUnreachable(self.path, err.strerror or str(err)) from None
            try:
                sock.sendall(line)
                buf = bytearray()
                while b"\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                    if len(buf) > MAX_ANSWER:
                        raise DaemonUnreachable(self.path, f"answer longer than {MAX_ANSWER} bytes")
            except TimeoutError:
                raise DaemonUnreachable(self.path, f"no answer within {self.timeout:g} s") from None
            except OSError as err:
                raise DaemonUnreachable(
                    self.path, f"connection lost ({err.strerror or err})"
                ) from None
        finally:
            if sock is not None:
                sock.close()
        if b"\n" not in buf:
            raise DaemonUnreachable(self.path, "the daemon closed the connection without answering")
        try:
            return json.loads(bytes(buf).split(b"\n", 1)[0])
        except ValueError:
            raise DaemonUnreachable(
                self.path, "the answer is not JSON (is this a hidvfs socket?)"
            ) from None

    def register(
        self,
        pid: int,
        deadline_s: float | None = None,
        criticality: str = "lo",
        name: str = "",
        adopter: bool = False,
        slack: float | None = None,
    ) -> dict[str, Any]:
        """Register ``pid``; returns the job as the daemon recorded it, with ``warning`` when
        the daemon answered one (a deadline the gate can plan no operating point for: the job is
        registered all the same). ``adopter``: this process is ``pid``'s parent and a child
        subreaper, so what ``pid`` leaves behind stays below it and the daemon counts it as
        the job's. ``slack`` instead of ``deadline_s``: the daemon sets the deadline to slack
        x the job's reference makespan (the job's ``deadline_s`` says it)."""
        req = {
            "op": "register",
            "pid": pid,
            "deadline_s": deadline_s,
            "criticality": criticality,
            "name": name,
        }
        if slack is not None:
            req["slack"] = slack
        if adopter:
            req["adopter"] = True
        try:
            answer = self.request(req)
        except RegistryError as err:
            if slack is not None and "'slack'" in str(err) and "unknown field" in str(err):
                raise RegistryError(
                    "register",
                    "this daemon does not take a slack (it predates it: restart it after the "
                    "upgrade), or give a deadline in seconds",
                ) from None
            if not adopter or "'adopter'" not in str(err):
                raise
            # a daemon from before the field (upgraded, not restarted yet): as it was
            del req["adopter"]
            answer = self.request(req)
        job = answer["job"]
        if answer.get("warning") and isinstance(job, dict):
            job = {**job, "warning": str(answer["warning"])}
        return job

    def unregister(self, pid: int, exit: JobExit | None = None) -> dict[str, Any]:
        """Drop ``pid``'s job; ``exit``: how it ended (its launcher reaped it), so the daemon
        counts a failed job apart instead of scoring it by time. A daemon that predates the
        field is asked again without it (it scores the job by time, as it always did)."""
        req: dict[str, Any] = {"op": "unregister", "pid": pid}
        if exit is not None:
            req["exit"] = {
                "code": exit.code,
                "signal": exit.signal,
                "stopped_by": exit.stopped_by,
            }
        try:
            return self.request(req)["job"]
        except RegistryError as err:
            if exit is None or "'exit'" not in err.error or "unknown field" not in err.error:
                raise
            del req["exit"]
            return self.request(req)["job"]

    def profile(self, name: str) -> dict[str, Any] | None:
        """The reference profile the daemon would give a job named ``name`` (its version and
        reference makespan), or None; raises :class:`RegistryError` from a daemon that
        predates the op."""
        prof = self.request({"op": "profile", "name": name}).get("profile")
        return prof if isinstance(prof, dict) else None

    def status(self) -> dict[str, Any]:
        """The daemon's status dict (what ``--status-file`` holds) plus ``jobs``: the
        registered jobs with their elapsed time."""
        answer = self.request({"op": "status"})
        status, jobs = answer.get("status") or {}, answer.get("jobs") or []
        if not isinstance(status, dict):
            raise UnreadableStatus(self.path, f"status is {type(status).__name__}, not an object")
        if not isinstance(jobs, list):
            raise UnreadableStatus(self.path, f"jobs is {type(jobs).__name__}, not a list")
        return {**status, "jobs": jobs}


def wait_reaping(proc) -> int:
    """Wait for ``proc`` while reaping the orphans this subreaper adopts (they would stay
    zombies, holding their pids, until ``hidvfs run`` exits): each exit is looked at without
    reaping it first, so ``proc``'s own status is left for ``proc.wait()``. It reaps any
    child of this process: meant for ``hidvfs run``, whose one child is the command."""
    while proc.returncode is None:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # no child left at all: proc was reaped elsewhere
            break
        if info.si_pid == proc.pid:
            break
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass
    rc = proc.wait()
    try:  # and those that had already ended below it (they came with its exit)
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    return rc


def _check_registration(
    deadline_s: float | None, criticality: str, name: str, slack: float | None = None
) -> None:
    """The daemon's own checks of a registration, before anything is launched: a command it
    would refuse must not start (and be stopped again) with its side effects done."""
    from daemon.registry import RequestError, parse_request

    req = {"op": "register", "pid": os.getpid(), "deadline_s": deadline_s}
    req.update(criticality=criticality, name=name)
    if slack is not None:
        req["slack"] = slack
    try:
        parse_request(json.dumps(req).encode())
    except RequestError as err:
        raise RegistryError("register", str(err)) from None


def _check_profile(client: RegistryClient, name: str) -> None:
    """``--slack`` needs the job's reference profile: asked before anything is launched (a
    daemon that predates the question refuses at the registration instead)."""
    try:
        prof = client.profile(name)
    except RegistryError as err:
        if "unknown op" in err.error:
            return
        raise
    if prof is None:
        raise RegistryError(
            "register",
            f"no reference profile for {name!r} on this board, so a deadline of slack x its "
            f"reference makespan cannot be set; measure one (sudo hidvfs profile measure "
            f"--name {name} -- CMD) or give a deadline in seconds (--deadline)",
        )


def _tree(pid: int) -> list:
    """``pid`` and every process below it, as psutil processes (a later signal through them
    cannot reach a reused pid); empty when ``pid`` is gone."""
    import psutil

    try:
        return _below(psutil.Process(pid))
    except psutil.Error:
        return []


def _below(root) -> list:
    """``root`` (a psutil process) and every process below it; empty when it is gone, or its
    pid is another process's now."""
    import psutil

    try:
        return [root, *root.children(recursive=True)] if root.is_running() else []
    except psutil.Error:
        return []


def _signal_all(procs: list, signum: int) -> None:
    import psutil

    for p in procs:
        try:
            p.send_signal(signum)
        except psutil.Error:
            pass


def _stop_refused(proc: subprocess.Popen) -> None:
    """Stop a command the daemon would not take: SIGTERM, then SIGKILL to it and what it
    started if it is still there after :data:`STOP_GRACE_S` (one that ignores SIGTERM ran
    to its end before the refusal was said)."""
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_all(_tree(proc.pid), signal.SIGKILL)
        proc.wait()


def _terminal_sent_it(pid: int) -> bool:
    """Whether a SIGINT is most likely the terminal's Ctrl-C: this process's group is the
    foreground group of its terminal and the command ``pid`` is in it, so the command got the
    same SIGINT and a second one would cut short what it does on the first (a REPL, a
    cleanup). A ``kill -INT`` of hidvfs run alone while it runs in the foreground is taken
    for one too."""
    try:
        if os.getpgid(pid) != os.getpgrp():
            return False
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal (a service, a script, a test), or pid gone
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


class _PassOn:
    """What ``hidvfs run`` does with a SIGTERM, SIGHUP or SIGINT (the ``pass_on`` of a
    :class:`~daemon.stopsignals.PassOnSignals`): it passes it to the command and to what the
    command started, then SIGKILLs those still there after :data:`STOP_GRACE_S`, so no part
    of the job outlives ``hidvfs run`` or stays registered. The processes are signalled
    one by one, not as a group: the command runs in ``hidvfs run``'s process group (as a
    shell runs a foreground command: it reads the terminal and gets its Ctrl-C), which a
    group kill would end too, before it could unregister the job."""

    def __init__(self) -> None:
        self.pid: int | None = None  # the command, once launched
        self.pending: int | None = None  # a signal taken before it was
        #: the first stop signal hidvfs run got, passed on or not (a terminal's Ctrl-C, which
        #: the command got itself): the job was stopped, its makespan is no completion
        self.got: str | None = None
        self.told: list = []  # psutil processes, the command first
        self.deadline: float | None = None
        self._timer: threading.Timer | None = None

    def __call__(self, signum: int) -> bool:
        self.got = self.got or signal.Signals(signum).name
        if signum == signal.SIGINT and _terminal_sent_it(self.pid or os.getpid()):
            return False
        if self.pid is None:
            self.pending = self.pending or signum
        else:
            self._tell(signum)
        return True

    def launched(self, pid: int) -> None:
        self.pid = pid
        if self.pending is not None:
            self._tell(self.pending)

    def _tell(self, signum: int) -> None:
        tree = _tree(self.pid)
        if not tree:  # the command has ended: its wait returns now
            return
        _signal_all(tree, signum)
        self.told.extend(tree)
        if self._timer is None:
            self.deadline = time.monotonic() + STOP_GRACE_S
            self._timer = threading.Timer(STOP_GRACE_S, self._kill)
            self._timer.daemon = True
            self._timer.start()

    def _kill(self) -> None:
        """Past the grace (in the timer's thread): psutil, not the Popen, whose reaping is
        the main thread's."""
        _signal_all([*self.told, *_below(self.told[0])], signal.SIGKILL)

    def finish(self) -> None:
        """After the command exited: what else was told to stop has until the deadline."""
        if self._timer is None:
            return
        self._timer.cancel()
        import psutil

        left = list({p.pid: p for p in self.told if p.pid != self.pid}.values())
        _gone, alive = psutil.wait_procs(left, timeout=max(0.0, self.deadline - time.monotonic()))
        _signal_all(alive, signal.SIGKILL)


def _warn(text: str) -> None:
    """``hidvfs: warning: ...`` on stderr; one that cannot be written (stderr closed) must
    not stop the job."""
    try:
        print(f"hidvfs: warning: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def run_registered(
    command: list[str],
    deadline_s: float | None = None,
    criticality: str = "lo",
    name: str | None = None,
    socket_path: str = DEFAULT_SOCKET,
    client: RegistryClient | None = None,
    on_registered: Callable[[dict[str, Any]], None] | None = None,
    run_if_unreachable: bool = False,
    on_unmanaged: Callable[[dict[str, Any]], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    slack: float | None = None,
) -> dict[str, Any]:
    """``hidvfs run``: launch ``command``, register it, wait for it, unregister it.

    ``slack`` instead of ``deadline_s``: the daemon sets the deadline to slack x the job's
    reference makespan, and the record's ``deadline_s`` is the one it set.

    ``on_registered(job)`` is called with the daemon's record of the job right after it
    registered (e.g. to warn that it has no reference profile). A warning the daemon
    answered the registration with (a deadline the gate can plan no operating point for: the command runs
    all the same) goes to ``on_warning(text)``, by default to stderr as
    ``hidvfs: warning: ...``.

    The daemon is asked first, so an unreachable daemon fails before anything is launched,
    unless ``run_if_unreachable``: then the command runs unmanaged (the daemon steers nothing,
    ``unmanaged_reason`` says why), as it also does when the daemon goes away before the
    registration. ``on_unmanaged(job)`` (pid, name, unmanaged: the reason) is called as soon
    as the run is known to be unmanaged: at its start when the daemon is unreachable, so a
    long job's user is told then.

    A SIGTERM, SIGHUP or SIGINT while the command runs is passed on to it (:class:`_PassOn`:
    SIGKILL past :data:`STOP_GRACE_S`), its end awaited and the job unregistered; the record
    names it in ``stopped_by``. A Ctrl-C the command got from the terminal is its own to act
    on: not passed on, not recorded.
    Returns the run's record: name, pid, returncode (shell style: 128 + signal when killed),
    makespan_s (launch to exit), deadline_s, criticality, deadline_met (None without a
    deadline, or for a command that failed: a non-zero exit, a signal, stopped by a signal
    hidvfs run got, Ctrl-C included), failure (why, or None) and stopped_by. The daemon is
    told how the command ended when it is unregistered (the ``exit`` of the request), so it
    counts a failed job as failed, not as a deadline met or missed.
    """
    if not command:
        raise ValueError("no command given to run")
    client = client or RegistryClient(socket_path)
    down: str | None = None  # why the daemon cannot take the job
    try:
        client.status()  # reachable? (raises DaemonUnreachable with the how-to-check hint)
    except DaemonUnreachable as err:
        if not run_if_unreachable:
            raise
        down = f"the daemon is unreachable: {err.reason}"
    clock = MonotonicClock()
    name = name or os.path.basename(command[0])
    _check_registration(deadline_s, criticality, name, slack)
    if slack is not None and down is None:
        _check_profile(client, name)
    was_adopting = adopts_orphans()  # (put back after: a caller may be a test runner)
    adopter = was_adopting or adopt_orphans()
    pass_on = _PassOn()
    signals = PassOnSignals(pass_on)
    try:
        signals.install()
        t0 = clock.now()
        proc = spawn(command)
        pass_on.launched(proc.pid)
        job: dict[str, Any] = {}
        try:
            if down is None:
                job = client.register(
                    proc.pid,
                    deadline_s=deadline_s,
                    criticality=criticality,
                    name=name,
                    adopter=adopter,
                    slack=slack,
                )
                if slack is not None and isinstance(job.get("deadline_s"), (int, float)):
                    deadline_s = float(job["deadline_s"])
        except RegistryError:
            if proc.poll() is None:  # a live child the daemon refused: do not run it unmanaged
                _stop_refused(proc)
                raise
            # it ended before the daemon saw it (a short command): its result still counts
            job = {"unmanaged": "it ended before the daemon registered it"}
        except DaemonUnreachable as err:  # the daemon went away since the status
            if not run_if_unreachable:
                _stop_refused(proc)
                raise
            down = f"the daemon is unreachable: {err.reason}"
        except BaseException:
            _stop_refused(proc)
            raise
        if down is not None:
            job = {"unmanaged": down}
        if job.get("unmanaged"):
            job = {"pid": proc.pid, "name": name, **job}
            if on_unmanaged is not None:
                on_unmanaged(job)
        else:
            if job.get("warning"):
                (on_warning or _warn)(job["warning"])
            if on_registered is not None:
                on_registered(job)
        # a SIGTERM, SIGHUP or SIGINT meanwhile is passed on (pass_on): the wait goes on
        rc = wait_reaping(proc) if adopter else proc.wait()
        makespan = clock.now() - t0
        pass_on.finish()
        ended = JobExit(
            code=rc if rc >= 0 else None,
            signal=-rc if rc < 0 else None,
            # stopped: by a signal passed on, or a Ctrl-C the command got from the terminal
            stopped_by=signals.received or pass_on.got,
        )
        if down is None:
            try:
                client.unregister(proc.pid, ended)
            except RegistryError:
                pass  # the daemon already saw it exit and dropped it
            except DaemonUnreachable:
                pass  # the daemon stopped meanwhile; nothing left to tell it
    finally:
        signals.restore()
        if adopter and not was_adopting:
            adopt_orphans(False)
    return {
        "name": name,
        "pid": proc.pid,
        "command": list(command),
        "returncode": rc if rc >= 0 else 128 - rc,
        "signal": -rc if rc < 0 else None,
        "makespan_s": makespan,
        "deadline_s": deadline_s,
        "criticality": criticality,
        # None without a deadline, and for a command that failed (a non-zero exit, a signal)
        # or was stopped: not scored, as the daemon counts it (failed, neither met nor missed)
        "deadline_met": (
            None if deadline_s is None or ended.failure is not None else makespan <= deadline_s
        ),
        # why it is not scored ("exit 1", "killed by SIGSEGV", "stopped by SIGTERM"), or None
        "failure": ended.failure,
        # the reference profile the daemon planned with (None: the deadline was not planned)
        "profile_version": job.get("profile_version"),
        # the daemon never steered it: it ended before the registration, or (with
        # run_if_unreachable) the daemon could not be reached
        "unmanaged": bool(job.get("unmanaged")),
        "unmanaged_reason": job.get("unmanaged") or None,
        # the signal hidvfs run got and passed on to the command ("SIGTERM"), or None
        "stopped_by": signals.received,
    }
