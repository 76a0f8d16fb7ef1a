"""The job registry: the requests of its newline-delimited JSON protocol, checked and recorded
in the daemon's job table. The Unix-socket server that speaks the protocol is
:mod:`daemon.registryserver`.

Requests (one JSON object per line)::

    {"op": "register", "pid": 1234, "deadline_s": 5.0, "criticality": "hi", "name": "fft"}
    {"op": "unregister", "pid": 1234}
    {"op": "unregister", "pid": 1234, "exit": {"code": 0, "signal": null, "stopped_by": null}}
    {"op": "status"}
    {"op": "profile", "name": "fft"}   -> the reference profile a registration would get, or null

``"slack": 1.5`` instead of ``deadline_s`` sets the soft deadline to 1.5 x the reference
makespan of the profile stored under the job's name (the answer's job carries the deadline
set); a name without a profile is refused.
``"adopter": true`` in a register says the job's parent is a child subreaper (``hidvfs run``):
what the job leaves behind (a helper that double-forks) stays below that parent, and the daemon
counts it as the job's when it gives the originals back. Taken only for a parent the client
may speak for, never init or the daemon.

``"exit"`` in an unregister (optional; ``hidvfs run`` sends it once it has reaped its command)
says how the job ended: ``code`` its exit status (0 to 255) or ``signal`` the signal that
killed it (1 to 127), one of the two, and ``stopped_by`` the signal ``hidvfs run`` itself got
and passed on ("SIGTERM", a Ctrl-C's "SIGINT"), or null. A job that failed (a non-zero code, a
signal, or stopped) is counted apart as failed, neither met nor missed. Without it (an older
client, a job whose end the daemon saw alone: an orphan after ``hidvfs run`` was SIGKILLed) the
job is scored by time. The loop waits a little (``jobs.REPORT_WAIT_S``) for the word of a
job's live launcher (its adopter) when it sees the job end first.

Answers are one line each: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. A
register answer may carry ``"warning": "..."``: the job is registered, but its reference
profile says no operating point of the board can meet its deadline (``deadline_check``). Every
malformed request (bad UTF-8 or JSON, unknown op or field, missing or mistyped field, a pid
that does not exist, a line over 64 KiB (skipped up to its newline), a client hanging up
mid-line) gets an error answer and never stops the server. Registered jobs land in the daemon's :class:`~daemon.jobs.JobTable`,
which the control loop reads every tick.

A client that is not root may only register its own processes (checked with
SO_PEERCRED when the daemon supplies ``pid_owner``): real, effective and saved uids all its
own, so not a setuid program it started; and at most ``MAX_JOBS_PER_UID`` of them, while the
last ``ROOT_JOB_RESERVE`` slots of the table stay root's.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import threading
import traceback
from collections.abc import Callable
from typing import Any

from agents.deadlines import MAX_NAME  # the names profiles are stored under
from daemon.jobs import JobEntry, JobExit, JobTable
from daemon.logs import format_value, log_event
from platforms.observation import JobProfile
from platforms.procs import SetidProcess

#: registered jobs one client that is not root may have at once. Each live job costs the
#: control loop a look at its process every tick and a placement of its whole tree every
#: REAPPLY_S; the boards hidvfs runs on have 4 to 12 cores, so 64 jobs of one user are far
#: more than it can give cores to, while 64 jobs cost the loop little (measured on a fake
#: TX2 tree: 50 single-process jobs, 10 ticks/s at about 5 % of a core; 200, about 15 %)
MAX_JOBS_PER_UID = 64
#: slots of the job table only root may fill: the administrator can still register when
#: users have filled the rest
ROOT_JOB_RESERVE = 32
#: a repeated internal error is logged with its traceback once per this many seconds
INTERNAL_ERROR_LOG_S = 60.0
OPS = ("register", "unregister", "status", "profile")
#: the largest slack a registration may ask for (a deadline that far out plans nothing)
MAX_SLACK = 1000.0
#: the fields of an unregister's ``exit``
EXIT_FIELDS = ("code", "signal", "stopped_by")
FIELDS = {
    "register": ("op", "pid", "deadline_s", "slack", "criticality", "name", "adopter"),
    "unregister": ("op", "pid", "exit"),
    "status": ("op",),
    "profile": ("op", "name"),
}

log = logging.getLogger("hidvfs.registry")


class RequestError(ValueError):
    """A request the registry refuses; the message is sent back to the client."""


# --------------------------------------------------------------------------------------------
# Request validation (pure)


def _field_hint(name: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_request(line: bytes) -> dict[str, Any]:
    """Decode and validate one request line; RequestError names what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("request is not valid UTF-8") from None
    try:
        req = json.loads(text)
    except json.JSONDecodeError as err:
        raise RequestError(f"malformed JSON: {err.msg} at column {err.colno}") from None
    except RecursionError:  # '[' * 60000: no request nests; not an internal error either
        raise RequestError("malformed JSON: nested too deeply") from None
    except ValueError as err:  # an integer of more than 4300 digits (int conversion limit)
        raise RequestError(f"malformed JSON: {str(err)[:120]}") from None
    if not isinstance(req, dict):
        raise RequestError(f"a request must be a JSON object, got {type(req).__name__}")
    if "op" not in req:
        raise RequestError(f"missing field 'op' (one of {', '.join(OPS)})")
    op = req["op"]
    if not isinstance(op, str) or op not in OPS:
        raise RequestError(
            f"unknown op {op!r:.60}{_field_hint(str(op)[:60], OPS)}; known ops: {', '.join(OPS)}"
        )
    allowed = FIELDS[op]
    for key in req:
        if key not in allowed:
            raise RequestError(
                f"unknown field {key!r:.60} for op '{op}'{_field_hint(key[:60], allowed)}; allowed: {', '.join(allowed)}"
            )
    out: dict[str, Any] = {"op": op}
    if op == "profile":
        name = req.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise RequestError(
                f"field 'name' must be a job name of 1 to {MAX_NAME} characters, got {name!r:.60}"
            )
        out["name"] = name
    if op in ("register", "unregister"):
        if "pid" not in req:
            raise RequestError(f"missing field 'pid' (a positive integer) for op '{op}'")
        pid = req["pid"]
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise RequestError(f"field 'pid' must be a positive integer, got {pid!r:.60}")
        out["pid"] = pid
    if op == "unregister" and req.get("exit") is not None:
        out["exit"] = _parse_exit(req["exit"])
    if op == "register":
        deadline = req.get("deadline_s")
        if deadline is not None:
            if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
                raise RequestError(
                    f"field 'deadline_s' must be a number of seconds > 0 or null, got {deadline!r:.60}"
                )
            if not math.isfinite(deadline) or deadline <= 0:
                raise RequestError(
                    f"field 'deadline_s' must be a number of seconds > 0 or null, got {deadline!r:.60}"
                )
            deadline = float(deadline)
        slack = req.get("slack")
        if slack is not None:
            if (
                isinstance(slack, bool)
                or not isinstance(slack, (int, float))
                or not math.isfinite(slack)
                or not 1 <= slack <= MAX_SLACK
            ):
                raise RequestError(
                    f"field 'slack' must be a number from 1 to {MAX_SLACK:g} (the deadline is "
                    f"slack x the job's reference makespan) or null, got {slack!r:.60}"
                )
            if deadline is not None:
                raise RequestError("give 'deadline_s' or 'slack', not both")
            slack = float(slack)
        crit = req.get("criticality", "lo")
        if crit not in ("hi", "lo"):
            raise RequestError(f"field 'criticality' must be 'hi' or 'lo', got {crit!r:.60}")
        name = req.get("name", "")
        if (
            not isinstance(name, str)
            or len(name) > MAX_NAME
            or not name.isprintable()
            or name.strip() != name  # " fib" would never find the profile "fib"
        ):
            raise RequestError(
                f"field 'name' must be a printable string of at most {MAX_NAME} characters, "
                f"without leading or trailing spaces, got {name!r:.60}"
            )
        adopter = req.get("adopter", False)
        if not isinstance(adopter, bool):
            raise RequestError(f"field 'adopter' must be true or false, got {adopter!r:.60}")
        out.update(
            deadline_s=deadline,
            slack=slack,
            criticality=crit,
            name=name or f"pid{out['pid']}",
            adopter=adopter,
        )
    return out


def _parse_exit(raw: Any) -> JobExit:
    """An unregister's ``exit``: ``{"code": 0..255 | null, "signal": 1..127 | null,
    "stopped_by": "SIGTERM" | null}``, exactly one of code and signal."""
    if not isinstance(raw, dict):
        raise RequestError(
            f"field 'exit' must be an object with {', '.join(EXIT_FIELDS)}, got {raw!r:.60}"
        )
    for key in raw:
        if key not in EXIT_FIELDS:
            raise RequestError(
                f"unknown field {key!r:.60} in 'exit'{_field_hint(str(key)[:60], EXIT_FIELDS)}; "
                f"allowed: {', '.join(EXIT_FIELDS)}"
            )

    def small_int(key: str, lo: int, hi: int) -> int | None:
        v = raw.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise RequestError(
                f"field 'exit.{key}' must be an integer from {lo} to {hi} or null, got {v!r:.60}"
            )
        return v

    code, sig = small_int("code", 0, 255), small_int("signal", 1, 127)
    if (code is None) == (sig is None):
        raise RequestError(
            "field 'exit' must give one of 'code' (it exited) and 'signal' (a signal killed it)"
        )
    stopped = raw.get("stopped_by")
    if stopped is not None and (
        not isinstance(stopped, str)
        or not 4 <= len(stopped) <= 16
        or not stopped.startswith("SIG")
        or not stopped[3:].replace("+", "").replace("-", "").isalnum()
        or not stopped.isascii()
    ):
        raise RequestError(
            f"field 'exit.stopped_by' must be a signal name such as 'SIGTERM' or null, got {stopped!r:.60}"
        )
    return JobExit(code=code, signal=sig, stopped_by=stopped)


def owner_refusal(
    pid: int, registrant_uid: int | None, pid_owner: Callable[[int], int | None]
) -> str | None:
    """Why a client (or, at a restart, a job's registrant) that is not root may not have
    ``pid`` steered, or None: only a process whose real, effective and saved uids are all
    its own. A process running a setuid or setgid program acts with rights the client does
    not have (``su``: effective uid root's), and one whose owner does not read has gone
    (fails closed). Shared by the registry and the take-up at a restart."""
    if registrant_uid in (None, 0):
        return None
    try:
        owner = pid_owner(pid)
    except SetidProcess as err:
        return (
            f"{err}; a client with uid {registrant_uid} may only register a "
            "process that runs with its own ids: a command that needs root is registered by "
            "root (sudo hidvfs run -- CMD)"
        )
    if owner is None:
        return f"pid {pid} does not exist"
    if owner != registrant_uid:
        return (
            f"pid {pid} belongs to uid {owner}; a client with uid {registrant_uid} may only "
            "register its own processes"
        )
    return None


def deadline_from_slack(name: str, profile: JobProfile | None, slack: float) -> float:
    """The soft deadline ``slack x`` the reference makespan of ``name``'s profile; a job
    without one is refused (there is nothing to take the slack of)."""
    if profile is None:
        raise RequestError(
            f"no reference profile for {name!r} on this board, so a deadline of slack x its "
            f"reference makespan cannot be set; measure one (sudo hidvfs profile measure "
            f"--name {name} -- CMD) or give a deadline in seconds (--deadline)"
        )
    return slack * profile.ref_makespan_s


def job_to_json(entry: JobEntry, now: float | None = None) -> dict[str, Any]:
    """A job as the registry answers it; with ``now`` (a status) also its ``elapsed_s`` and,
    for a deadline job, ``remaining_s`` (0 once past it) and ``overdue_s`` (how far past
    its deadline it runs; 0 while within it), None without a deadline."""
    d = {
        "pid": entry.pid,
        "name": entry.name,
        "criticality": entry.criticality,
        "deadline_s": entry.deadline_s,
        "release_t": entry.release_t,
        # the reference profile the gate and the shield plan with (None: no profile)
        "profile_version": entry.profile.version if entry.profile else None,
    }
    if now is not None:
        elapsed = now - entry.release_t
        d["elapsed_s"] = round(elapsed, 6)
        dl = entry.deadline_s
        d["remaining_s"] = None if dl is None else round(max(0.0, dl - elapsed), 6)
        d["overdue_s"] = None if dl is None else round(max(0.0, elapsed - dl), 6)
    return d


# --------------------------------------------------------------------------------------------
# The registry (transport-free)


class JobRegistry:
    """Validates and records jobs into the daemon's JobTable; thread-safe.

    Collaborators are injected: ``now`` (the platform clock), ``alive(pid)`` (process control),
    ``status_provider()`` (the daemon's status dict), ``pid_owner(pid) -> uid`` (to stop a
    non-root client from registering someone else's process), ``profile_for(name)`` (a job
    profile lookup) and ``deadline_check(profile, deadline_s)`` (why no operating point of the
    board can meet the deadline, None when one may: :class:`daemon.profiles.DeadlineCheck`;
    the job is registered all the same, with the reason as its warning).
    """

    def __init__(
        self,
        table: JobTable | None = None,
        *,
        now: Callable[[], float],
        alive: Callable[[int], bool],
        status_provider: Callable[[], dict] | None = None,
        pid_owner: Callable[[int], int | None] | None = None,
        profile_for: Callable[[str], JobProfile | None] | None = None,
        max_jobs: int = 1024,
        max_jobs_per_uid: int = MAX_JOBS_PER_UID,
        root_job_reserve: int = ROOT_JOB_RESERVE,
        unmanageable: Callable[[int], str | None] | None = None,
        start_time: Callable[[int], float | None] | None = None,
        parent_of: Callable[[int], int | None] | None = None,
        deadline_check: Callable[[JobProfile, float], str | None] | None = None,
    ):
        self.table = table if table is not None else JobTable()
        self.now = now
        self.alive = alive
        self.status_provider = status_provider
        self.pid_owner = pid_owner
        self.profile_for = profile_for
        self.max_jobs = max_jobs
        self.max_jobs_per_uid = max_jobs_per_uid
        #: slots of the table only root may fill (at most half of it)
        self.root_job_reserve = max(0, min(root_job_reserve, max_jobs // 2))
        #: internal errors logged, by where they were raised: (when, repeats since)
        self._internal_errors: dict[str, tuple[float, int]] = {}
        self.unmanageable = unmanageable
        self.start_time = start_time
        self.parent_of = parent_of
        self.deadline_check = deadline_check
        self._lock = threading.Lock()  # makes check-then-insert atomic

    def register(
        self,
        pid: int,
        deadline_s: float | None = None,
        criticality: str = "lo",
        name: str = "",
        *,
        peer_uid: int | None = None,
        adopter: bool = False,
        slack: float | None = None,
    ) -> JobEntry:
        """Register ``pid``. With ``slack`` (instead of ``deadline_s``) its soft deadline is
        ``slack x`` the reference makespan of the profile stored under its name (models.md
        8), which it then must have."""
        why = self.unmanageable(pid) if self.unmanageable is not None else None
        if why is not None:
            raise RequestError(f"pid {pid} cannot be a job: {why}")
        if not self.alive(pid):
            raise RequestError(f"pid {pid} does not exist")
        # the process is known by its start time from here on: read first, so every check
        # below is about that process and not one that got its pid since
        start = self._started(pid)
        self._check_owner(pid, peer_uid)
        name = name or f"pid{pid}"
        # (not `if self.profile_for`: an empty store is falsy, and profiles added to it later
        # must still be found)
        profile = self.profile_for(name) if self.profile_for is not None else None
        if slack is not None:
            deadline_s = deadline_from_slack(name, profile, slack)
        warning = self._check_deadline(profile, deadline_s)
        with self._lock:
            # still the same process, and still the client's (it may have ended, or run a
            # setuid program, while the profile was looked up)
            if start is not None and self._started(pid) != start:
                raise RequestError(f"pid {pid} ended while it was being registered")
            self._check_owner(pid, peer_uid)
            if self.table.get(pid) is not None:
                raise RequestError(f"pid {pid} is already registered (unregister it first)")
            self._check_room(peer_uid)
            entry = JobEntry(
                pid=pid,
                name=name,
                release_t=self.now(),
                deadline_s=deadline_s,
                criticality=criticality,
                profile=profile,
                registrant_uid=peer_uid,
                start_time=start,
                adopter=self._adopter(pid, peer_uid) if adopter else None,
                warning=warning,
            )
            try:
                written = self.table.register(entry, defer_wait=True)
            except ValueError as err:
                raise RequestError(str(err)) from None
        if written is not None:  # its row on disk before the answer, the lock released
            written()
        # log_event quotes the name: "fib criticality=hi uid=0" must stay one field
        log_event(
            log,
            "job_registered",
            pid=pid,
            name=name,
            criticality=criticality,
            deadline_s=deadline_s,
            profile=f"v{profile.version}" if profile else "none",
            uid=peer_uid,
        )
        if warning is not None:
            log_event(
                log,
                "job_deadline_infeasible",
                level=logging.WARNING,
                pid=pid,
                name=name,
                criticality=criticality,
                deadline_s=deadline_s,
                detail=warning,
            )
        return entry

    def _started(self, pid: int) -> float | None:
        """``pid``'s start time; a pid without one has gone (fails closed). None when the
        daemon supplies no start times."""
        if self.start_time is None:
            return None
        start = self.start_time(pid)
        if start is None:
            raise RequestError(f"pid {pid} does not exist")
        return start

    def _check_owner(self, pid: int, peer_uid: int | None) -> None:
        """A client that is not root may register only a process of its own
        (:func:`owner_refusal`)."""
        if self.pid_owner is None:
            return
        why = owner_refusal(pid, peer_uid, self.pid_owner)
        if why is not None:
            raise RequestError(why)

    def _check_room(self, peer_uid: int | None) -> None:
        """Room in the table for one more job of ``peer_uid``: root up to ``max_jobs``; a
        user up to ``max_jobs_per_uid`` of its own, and only while the slots kept for root
        (``root_job_reserve``) stay free. Called under the lock."""
        total = len(self.table)
        if peer_uid in (None, 0):
            if total >= self.max_jobs:
                raise RequestError(f"too many registered jobs (limit {self.max_jobs})")
            return
        for_users = self.max_jobs - self.root_job_reserve
        if total >= for_users:
            raise RequestError(
                f"too many registered jobs (limit {for_users} for clients that are not root; "
                f"the last {self.root_job_reserve} of {self.max_jobs} are kept for root)"
            )
        mine = sum(1 for e in self.table.snapshot() if e.registrant_uid == peer_uid)
        if mine >= self.max_jobs_per_uid:
            raise RequestError(
                f"uid {peer_uid} has {mine} registered jobs, the most one user may have "
                f"(limit {self.max_jobs_per_uid} per uid); unregister some first"
            )

    def _check_deadline(self, profile: JobProfile | None, deadline_s: float | None) -> str | None:
        """Why the gate can plan no operating point for the deadline (None: one may, or nothing to tell
        without a profile or a deadline). A failing check costs the warning, not the job."""
        if self.deadline_check is None or profile is None or deadline_s is None:
            return None
        try:
            return self.deadline_check(profile, deadline_s)
        except Exception:  # noqa: BLE001 - a warning must never refuse a job
            log.exception("event=deadline_check_failed name=%s", format_value(profile.name))
            return None

    def unregister(
        self, pid: int, *, peer_uid: int | None = None, exit: JobExit | None = None
    ) -> JobEntry:
        """Drop a job. A non-root client may only drop a job it registered or a process it
        owns: another user's job would lose its deadline and its reservation. ``exit``: how
        the job ended, as its launcher (``hidvfs run``) says; taken when it has ended (a job
        the loop already saw end waits for this word: :meth:`JobTable.hold`)."""
        with self._lock:
            held = self.table.held(pid)
            entry = held if held is not None else self.table.get(pid)
            if entry is None:
                raise RequestError(f"pid {pid} is not registered")
            if peer_uid not in (None, 0) and entry.registrant_uid != peer_uid:
                try:
                    owner = self.pid_owner(pid) if self.pid_owner is not None else None
                except SetidProcess:  # running a setuid program: no one user's
                    owner = None
                if owner != peer_uid:
                    raise RequestError(
                        f"pid {pid} was registered by uid {entry.registrant_uid}; a client "
                        f"with uid {peer_uid} may only unregister its own jobs"
                    )
            ended = held is not None or not self.alive(pid)
        if ended:  # `hidvfs run` tells us as soon as its command exits: that is its end
            if held is not None:  # the loop saw it end first: its end, this word
                out = self.table.report(pid, exit)
            else:
                out = self.table.finish(pid, self.now(), exit=exit)
                if out is None:  # the loop held it between the look above and now
                    out = self.table.report(pid, exit)
            if out is None:
                raise RequestError(f"pid {pid} is not registered")
            return self._unregistered_ended(entry, out)
        gone = self.table.unregister(pid)
        if gone is None:  # it ended, and the loop held it, since the look above
            out = self.table.report(pid, exit)
            if out is None:
                raise RequestError(f"pid {pid} is not registered")
            return self._unregistered_ended(entry, out)
        log_event(log, "job_unregistered", pid=pid, name=gone.name)
        return gone

    @staticmethod
    def _unregistered_ended(entry: JobEntry, out) -> JobEntry:
        failed = {"failed": out.failure} if out.failure is not None else {}
        log_event(log, "job_unregistered", pid=entry.pid, name=entry.name, ended=True, **failed)
        return entry

    def list(self) -> list[JobEntry]:
        return sorted(self.table.snapshot(), key=lambda e: (e.release_t, e.pid))

    def status(self) -> dict[str, Any]:
        return dict(self.status_provider()) if self.status_provider else {}

    def _adopter(self, pid: int, peer_uid: int | None) -> tuple[int, float | None] | None:
        """The job's parent, when it says it adopts what the job leaves behind: only a parent
        the client may speak for (its own process, or any for root), never init or the
        daemon (their other descendants are not the job's)."""
        parent = self.parent_of(pid) if self.parent_of is not None else None
        if parent is None or parent <= 1:
            return None
        if self.unmanageable is not None and self.unmanageable(parent) is not None:
            return None
        if peer_uid not in (None, 0) and self.pid_owner is not None:
            try:
                if self.pid_owner(parent) != peer_uid:
                    return None
            except SetidProcess:  # a setuid parent is no one user's
                return None
        start = self.start_time(parent) if self.start_time is not None else None
        return parent, start

    def handle(self, req: dict[str, Any], peer_uid: int | None = None) -> dict[str, Any]:
        """Answer one validated request."""
        op = req["op"]
        if op == "register":
            e = self.register(
                req["pid"],
                req["deadline_s"],
                req["criticality"],
                req["name"],
                peer_uid=peer_uid,
                adopter=req.get("adopter", False),
                slack=req.get("slack"),
            )
            answer = {"ok": True, "job": job_to_json(e)}
            if e.warning is not None:
                answer["warning"] = e.warning
            return answer
        if op == "unregister":
            entry = self.unregister(req["pid"], peer_uid=peer_uid, exit=req.get("exit"))
            return {"ok": True, "job": job_to_json(entry)}
        if op == "profile":  # `hidvfs run --slack` asks before it launches anything
            prof = self.profile_for(req["name"]) if self.profile_for is not None else None
            return {
                "ok": True,
                "profile": None
                if prof is None
                else {"version": prof.version, "ref_makespan_s": prof.ref_makespan_s},
            }
        now = self.now()
        try:
            status = self.status()
        except Exception as err:  # noqa: BLE001 - a broken provider must not kill the server
            log.exception("event=status_provider_failed")
            raise RequestError(f"status unavailable: {type(err).__name__}: {err}") from None
        return {"ok": True, "status": status, "jobs": [job_to_json(e, now) for e in self.list()]}

    def handle_line(self, line: bytes, peer_uid: int | None = None) -> dict[str, Any]:
        """Answer one raw request line; never raises."""
        try:
            return self.handle(parse_request(line), peer_uid)
        except RequestError as err:
            return {"ok": False, "error": str(err)}
        except Exception as err:  # noqa: BLE001 - the server must keep serving
            self._log_internal(err)
            return {"ok": False, "error": f"internal error: {type(err).__name__}: {err!s:.200}"}

    def _log_internal(self, err: Exception) -> None:
        """An internal error, with its traceback the first time it is raised at one place;
        again at that place within INTERNAL_ERROR_LOG_S only counted, the count logged (one
        line, no traceback) with the next one after that. One client repeating a request
        that fails must not flood the journal."""
        frames = traceback.extract_tb(err.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        key = f"{type(err).__name__}@{where}"
        now = self.now()  # the daemon's clock, as every other time the registry keeps
        seen = self._internal_errors.get(key)
        if seen is not None and now - seen[0] < INTERNAL_ERROR_LOG_S:
            self._internal_errors[key] = (seen[0], seen[1] + 1)
            return
        if len(self._internal_errors) >= 64:  # places are few; keep the table small anyway
            self._internal_errors.clear()
        self._internal_errors[key] = (now, 0)
        if seen is None:
            log.exception("event=registry_internal_error where=%s", format_value(where))
            return
        log_event(
            log,
            "registry_internal_error",
            level=logging.ERROR,
            error=f"{type(err).__name__}: {err!s:.200}",
            where=where,
            repeats=seen[1],
            detail=f"raised {seen[1]} more times in {INTERNAL_ERROR_LOG_S:g} s; traceback logged before",
        )


def encode(answer: dict[str, Any]) -> bytes:
    return (json.dumps(answer, default=str, separators=(",", ":")) + "\n").encode()
