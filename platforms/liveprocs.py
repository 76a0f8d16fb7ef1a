"""Process control on a live board (psutil + the scheduler syscalls).

A job is its whole process tree: the registered pid and all its descendants, and every thread of
each (OpenMP workers are threads). CPU affinity and scheduling class are per thread on Linux,
so each tid is set on its own. A thread that exits meanwhile is skipped; a thread created while
we iterate inherits its creator's setting, and we re-list until no unseen tid appears. A pid
that has gone raises :class:`ProcessGone`; a refusal by the kernel becomes a PermissionError
that says which right is missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
import threading

import psutil

from platforms import paths
from platforms.procs import ProcessControl, ProcessGone, SetidProcess

#: how many times to re-list threads that appeared while we were setting the others
_MAX_PASSES = 4


def _denied(action: str, pid: int, err: BaseException) -> PermissionError:
    return PermissionError(
        errno.EPERM,
        f"{action} of pid {pid} was refused ({err}); the hidvfs daemon needs root "
        "(or CAP_SYS_NICE) to place and prioritise other users' processes",
    )


def thread_group(pid: int) -> int | None:
    """The process (thread group id, ``Tgid`` in ``/proc/PID/status``) that ``pid`` belongs
    to: ``pid`` itself for a process, its process's pid for a thread; None when it is gone."""
    try:
        with open(f"/proc/{int(pid)}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProcessMap:
    """Every process's parent and start time, from one pass over ``/proc`` (what psutil's
    ``children(recursive=True)`` reads anew at each call). Zombies are left out: they run
    nothing, and their children have already gone to a reaper."""

    def __init__(self) -> None:
        self.children: dict[int, list[int]] = {}
        self.start: dict[int, float] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            entries = []
        for entry in entries:
            if not entry.isdigit():
                continue
            fields = _stat_fields(int(entry))
            try:
                if fields is None or fields[0] == b"Z":
                    continue
                ppid, start = int(fields[1]), float(fields[19])
            except (ValueError, IndexError):
                continue
            self.start[int(entry)] = start
            self.children.setdefault(ppid, []).append(int(entry))

    def below(self, pid: int) -> list[int]:
        """The processes below ``pid``, parents before their children."""
        out: list[int] = []
        seen = {pid}
        todo = [pid]
        while todo:
            nxt = []
            for parent in todo:
                for child in self.children.get(parent, ()):
                    if child not in seen:
                        seen.add(child)
                        out.append(child)
                        nxt.append(child)
            todo = nxt
        return out


def proc_ids(pid: int) -> tuple[tuple[int, ...], tuple[int, ...], str] | None:
    """(real, effective, saved uids), (the same gids) and the program's name of ``pid`` from
    ``/proc/PID/status``; None when it has gone."""
    uids = gids = None
    name = ""
    try:
        with open(f"/proc/{int(pid)}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Name:"):
                    name = line[5:].strip().decode("utf-8", "replace")
                elif line.startswith(b"Uid:"):
                    uids = tuple(int(x) for x in line.split()[1:4])
                elif line.startswith(b"Gid:"):
                    gids = tuple(int(x) for x in line.split()[1:4])
                if uids is not None and gids is not None:
                    return uids, gids, name
    except (OSError, ValueError):
        return None
    return None


class LiveProcessControl(ProcessControl):
    def __init__(self) -> None:
        #: the process map of the round the calling thread is in (:meth:`process_map`)
        self._round = threading.local()
        #: the kernel has no /proc/PID/task/TID/children (built without
        #: CONFIG_PROC_CHILDREN): :meth:`_tree_now` reads a new process map instead
        self._no_children_files = False

    def _root(self, pid: int) -> psutil.Process:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise ProcessGone(pid)
            return proc
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise ProcessGone(pid) from None

    @contextlib.contextmanager
    def process_map(self, *, fresh_recheck: bool = False):
        """The tree walks of this thread inside share one :class:`ProcessMap`, read at the
        first walk: one pass over ``/proc`` per round instead of one per walk (several per
        job). A process forked after the pass is found at the next round; it inherited its
        parent's affinity and scheduling class meanwhile. With ``fresh_recheck`` (a release:
        there is no next round for the job, and a child forked while it was given back would
        keep its real-time priority for good) each walk's second and later looks read the
        tree as it is now (:meth:`_tree_now`)."""
        if getattr(self._round, "active", False):  # nested: the outer round's map
            outer = self._round.fresh
            self._round.fresh = outer or fresh_recheck  # a release inside keeps its recheck
            try:
                yield
            finally:
                self._round.fresh = outer
            return
        self._round.active, self._round.map = True, None
        self._round.fresh = fresh_recheck
        try:
            yield
        finally:
            self._round.active, self._round.map, self._round.fresh = False, None, False

    def _map(self) -> ProcessMap:
        if not getattr(self._round, "active", False):
            return ProcessMap()
        if self._round.map is None:
            self._round.map = ProcessMap()
        return self._round.map

    def _tree_map(self, pid: int) -> tuple[list[int], ProcessMap]:
        self._root(pid)  # gone or a zombie: ProcessGone
        pmap = self._map()
        return [pid, *pmap.below(pid)], pmap

    def _tree(self, pid: int) -> list[int]:
        """``pid`` and every process below it (pids)."""
        return self._tree_map(pid)[0]

    def tids(self, pid: int) -> list[int]:
        """Every thread id of ``pid``'s process tree (the root's first)."""
        return self._tids_of(self._tree(pid))

    def _tids_of(self, tree: list[int]) -> list[int]:
        """The thread ids of the processes of ``tree`` (its root first; a process below it
        that ended meanwhile is left out, the root's end is :class:`ProcessGone`)."""
        out: list[int] = []
        for i, proc in enumerate(tree):
            try:
                out.extend(self.own_tids(proc))
            except ProcessGone:
                if i == 0:
                    raise
        return out

    @staticmethod
    def own_tids(pid: int) -> list[int]:
        """The thread ids of ``pid`` alone (``/proc/PID/task``: no scan of every process)."""
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{int(pid)}/task"))
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessGone(pid) from None

    def _tids_now(self, pid: int) -> list[int]:
        """:meth:`tids` as the tree is now, whatever the round read."""
        return self._tids_of(self._tree_now(pid))

    def _tree_now(self, pid: int) -> list[int]:
        """``pid`` and every process below it now: from each thread's ``children`` file
        (``/proc/PID/task/TID/children``, the tree alone), or where the kernel has none
        (built without CONFIG_PROC_CHILDREN) from a new pass over ``/proc``."""
        self._root(pid)
        if self._no_children_files:
            return [pid, *ProcessMap().below(pid)]
        out, todo, seen = [pid], [pid], {pid}
        while todo:
            proc = todo.pop()
            try:
                tasks = os.listdir(f"/proc/{int(proc)}/task")
            except (FileNotFoundError, ProcessLookupError):
                continue  # gone meanwhile
            for tid in tasks:
                try:
                    with open(f"/proc/{int(proc)}/task/{tid}/children", "rb") as f:
                        kids = [int(k) for k in f.read().split()]
                except FileNotFoundError:
                    if os.path.isdir(f"/proc/{int(proc)}/task/{tid}"):
                        self._no_children_files = True  # this kernel has none: said once
                        return [pid, *ProcessMap().below(pid)]
                    continue
                except (ProcessLookupError, ValueError, OSError):
                    continue
                for kid in kids:
                    if kid not in seen:  # a pid reused during the walk must not loop it
                        seen.add(kid)
                        out.append(kid)
                        todo.append(kid)
        return out

    def _each_thread(self, pid: int, action: str, apply, *, tree: bool = True) -> None:
        listing = self.tids if tree else self.own_tids
        done: set[int] = set()
        for n in range(_MAX_PASSES):
            if n and tree and getattr(self._round, "fresh", False):
                listing = self._tids_now  # a release's recheck: the tree as it is now
            todo = [t for t in listing(pid) if t not in done]
            if not todo:
                return
            for tid in todo:
                try:
                    apply(tid)
                except ProcessLookupError:
                    pass  # the thread exited between listing and setting
                except PermissionError as err:
                    raise _denied(action, pid, err) from None
                done.add(tid)
        if not self.alive(pid):
            raise ProcessGone(pid)

    # -- ProcessControl ------------------------------------------------------------------------
    def alive(self, pid: int) -> bool:
        # one read of /proc/PID/stat (the loop asks for every job every tick)
        fields = _stat_fields(pid)
        return fields is not None and bool(fields) and fields[0] != b"Z"

    def set_affinity(self, pid: int, cpus: tuple[int, ...], *, tree: bool = True) -> None:
        mask = {int(c) for c in cpus}
        if not mask:
            raise ValueError(f"pid {pid}: an empty CPU set would leave the job nowhere to run")

        def apply(tid: int) -> None:
            try:
                os.sched_setaffinity(tid, mask)
            except OSError as err:
                if err.errno == errno.EINVAL:
                    raise ValueError(
                        f"pid {pid}: CPU set {sorted(mask)} has no online CPU this process may use"
                    ) from None
                raise

        self._each_thread(pid, "setting the CPU affinity", apply, tree=tree)

    def get_affinity(self, pid: int) -> tuple[int, ...]:
        try:
            return tuple(sorted(os.sched_getaffinity(pid)))
        except ProcessLookupError:
            raise ProcessGone(pid) from None
        except PermissionError as err:
            raise _denied("reading the CPU affinity", pid, err) from None

    def set_priority(
        self, pid: int, rt_priority: int = 0, nice: int = 0, *, tree: bool = True
    ) -> None:
        if not 0 <= rt_priority <= 99:
            raise ValueError(
                f"rt_priority must be 0 (SCHED_OTHER) or 1..99 (SCHED_FIFO), got {rt_priority}"
            )
        if not -20 <= nice <= 19:
            raise ValueError(f"nice must be in -20..19, got {nice}")

        if rt_priority > 0:

            def apply(tid: int) -> None:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(rt_priority))

            self._each_thread(pid, f"SCHED_FIFO priority {rt_priority}", apply, tree=tree)
            return

        def apply_other(tid: int) -> None:
            if os.sched_getscheduler(tid) != os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            # PRIO_PROCESS with a tid sets that one thread's nice value on Linux
            os.setpriority(os.PRIO_PROCESS, tid, nice)

        self._each_thread(pid, f"SCHED_OTHER nice {nice}", apply_other, tree=tree)

    def get_priority(self, pid: int) -> tuple[int, int]:
        """(rt_priority, nice) of the main thread: (1..99, 0) under SCHED_FIFO, (0, nice) else."""
        try:
            policy = os.sched_getscheduler(pid)
            if policy in (os.SCHED_FIFO, os.SCHED_RR):
                return os.sched_getparam(pid).sched_priority, 0
            return 0, os.getpriority(os.PRIO_PROCESS, pid)
        except ProcessLookupError:
            raise ProcessGone(pid) from None

    def set_own_affinity(self, pid: int, cpus: tuple[int, ...]) -> None:
        self.set_affinity(pid, cpus, tree=False)

    def set_own_priority(self, pid: int, rt_priority: int = 0, nice: int = 0) -> None:
        self.set_priority(pid, rt_priority, nice, tree=False)

    def descendants(self, pid: int) -> list[tuple[int, float | None]]:
        tree, pmap = self._tree_map(pid)
        return [(child, pmap.start.get(child)) for child in tree[1:]]

    def cpu_time(self, pid: int) -> float:
        """User + system seconds of the live tree, plus what its reaped children used."""
        total = 0.0
        for i, child in enumerate(self._tree(pid)):
            try:
                proc = psutil.Process(child)
                t = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                if i == 0:
                    raise ProcessGone(pid) from None
                continue
            except psutil.AccessDenied as err:
                raise _denied("reading the CPU time", child, err) from None
            total += (
                t.user
                + t.system
                + getattr(t, "children_user", 0.0)
                + getattr(t, "children_system", 0.0)
            )
        return total

    def start_time(self, pid: int) -> float | None:
        """Clock ticks since boot at which ``pid`` started (``/proc/PID/stat`` field 22): not
        psutil's create_time, which adds the boot time in wall-clock seconds and so moves
        when NTP steps the clock (every job would then look like a reused pid)."""
        fields = _stat_fields(pid)
        try:
            return None if fields is None else float(fields[19])
        except (ValueError, IndexError):
            return None

    def rt_allowed(self, pid: int) -> int:
        """Root's processes may take any priority; another user's only what its own
        RLIMIT_RTPRIO lets it set (the daemon must not hand out real-time priority). For a
        job root registered: one a user registered gets :meth:`rt_limit`."""
        try:
            proc = psutil.Process(pid)
            if proc.uids().effective == 0:
                return 99
            soft, _hard = proc.rlimit(psutil.RLIMIT_RTPRIO)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
            return 0
        return 99 if soft == psutil.RLIM_INFINITY else max(0, min(99, int(soft)))

    def rt_limit(self, pid: int) -> int:
        """The lowest soft RLIMIT_RTPRIO over ``pid``'s tree (every process the placement
        sets), whoever owns each process: an effective uid 0 (a setuid program the job ran)
        counts for nothing. One that does not read counts as 0."""
        lowest = 99
        for i, proc in enumerate(self._tree(pid)):
            try:
                soft, _hard = resource.prlimit(proc, resource.RLIMIT_RTPRIO)
            except ProcessLookupError:
                if i == 0:
                    raise ProcessGone(pid) from None
                continue
            except OSError:
                return 0
            lowest = min(lowest, 99 if soft == resource.RLIM_INFINITY else max(0, min(99, soft)))
        return lowest

    def identity(self, pid: int) -> tuple | None:
        """(start time, executable): another executable is an exec (a setuid one, say)."""
        start = self.start_time(pid)
        if start is None:
            return None
        try:
            exe = os.readlink(f"/proc/{int(pid)}/exe")
        except OSError:
            exe = None
        return start, exe

    def machine_cpus(self) -> frozenset[int] | None:
        try:
            with open("/sys/devices/system/cpu/online", encoding="ascii") as f:
                return frozenset(paths.parse_cpu_ranges(f.read())) or None
        except (OSError, ValueError):
            return None

    def unmanageable(self, pid: int) -> str | None:
        # first: a thread id also has a /proc entry (hidden from listings), so the daemon's
        # own thread, or init's, would pass every check below as a process of its own
        tgid = thread_group(pid)
        if tgid is not None and tgid != pid:
            return (
                f"pid {pid} is a thread of process {tgid}, not a process: register the "
                f"process ({tgid}) instead"
            )
        if pid == 1:
            return "pid 1 is init: steering it would steer every process it starts"
        me = os.getpid()
        if pid == me:
            return "that is the daemon itself"
        try:
            proc = psutil.Process(pid)
            if pid == 2 or proc.ppid() == 2:
                return f"pid {pid} is a kernel thread: its CPU affinity cannot be set"
            if pid in {p.pid for p in psutil.Process(me).parents()}:
                return f"pid {pid} is an ancestor of the daemon: it would steer the daemon"
            if proc.status() == psutil.STATUS_ZOMBIE:
                return f"pid {pid} has exited (a zombie not yet reaped)"
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied:
            return None
        return None

    def parent(self, pid: int) -> int | None:
        try:
            return psutil.Process(pid).ppid()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return None

    def owner_uid(self, pid: int) -> int | None:
        """The uid owning ``pid`` (None when it has gone): its real uid, when its effective
        and saved uids are that uid too and its gids agree among themselves. A process that
        runs a setuid or setgid program (``su``, ``newgrp``: real uid the user's, effective
        root's) raises :class:`~platforms.procs.SetidProcess`: it is no one user's."""
        ids = proc_ids(pid)
        if ids is None:
            return None
        uids, gids, name = ids
        if len(set(uids)) > 1 or len(set(gids)) > 1:
            raise SetidProcess(pid, uids, gids, program=name)
        return uids[0]


#: prctl(2) options: orphans below this process are reparented to it, not to init
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def _prctl():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def adopts_orphans() -> bool:
    """Whether this process is a child subreaper now."""
    import ctypes

    prctl, flag = _prctl(), ctypes.c_int(0)
    return (
        prctl is not None
        and prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
        and bool(flag.value)
    )


def adopt_orphans(on: bool = True) -> bool:
    """Make this process a child subreaper (Linux 3.4+), or stop: a process the command it
    launches leaves behind (a helper that double-forks, a daemonised worker) becomes this
    process's child instead of init's, so the daemon still finds it below ``hidvfs run``
    and gives it the job's originals back. False where the kernel or libc refuses."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


class LaunchError(OSError):
    """A command that could not be launched: its message names the command and the reason,
    without the ``[Errno N]`` prefix, and :attr:`exit_code` is the status a shell gives it:
    127 when it is not found, 126 when it is found but cannot be executed (permission, not
    an executable, a folder). An OSError still (``errno`` kept) for callers that catch one."""

    def __init__(self, command: str, err: OSError):
        super().__init__(err.errno, err.strerror)
        self.command = command
        self.exit_code = 127 if err.errno == errno.ENOENT else 126
        reason = err.strerror or str(err)
        if err.errno == errno.ENOENT and os.sep not in command:
            reason = "not found in PATH"
        self.message = f"cannot launch {command!r}: {reason}"

    def __str__(self) -> str:
        return self.message


def spawn(command: list[str]) -> subprocess.Popen:
    """Launch a job (``hidvfs run``); an unknown or non-executable command names itself
    (:class:`LaunchError`, with the exit status a shell would give)."""
    if not command:
        raise ValueError("no command given to run")
    try:
        return subprocess.Popen(command)
    except OSError as err:
        raise LaunchError(command[0], err) from None


def raise_stack_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_STACK to its hard limit (unlimited unless a lower hard
    limit forbids it), the ``ulimit -s unlimited`` some kernels need for their main thread's
    deep recursion; returns the previous (soft, hard) so a caller can put it back."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (old[1], old[1]))
    return old


#: prctl(2) option: the signal this process gets when the thread that forked it exits
PR_SET_PDEATHSIG = 1


def child_setup(unlimited_stack: bool):
    """The function run in a benchmark's child between fork and exec, or None.

    On Linux it asks for SIGKILL when the parent dies (``PR_SET_PDEATHSIG``): the kernel runs
    in its own session, so nothing else would stop it when the campaign is SIGKILLed, and a
    resumed campaign would measure beside it. prctl is looked up here, in the parent, so the
    child only calls it. The signal is sent when the parent *thread* that forked exits, so
    spawn from a thread that lives as long as the job (the campaign spawns from its main
    thread). It survives exec, except of a setuid/setgid or file-capability binary."""
    import signal
    import sys

    prctl = _prctl() if sys.platform.startswith("linux") else None
    parent = os.getpid()
    if prctl is None and not unlimited_stack:
        return None

    def setup() -> None:
        if prctl is not None and prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before the request took effect
                os.kill(os.getpid(), signal.SIGKILL)
        if unlimited_stack:
            raise_stack_limit()

    return setup


def spawn_job(
    argv: list[str],
    env: dict[str, str],
    stdout,
    *,
    unlimited_stack: bool = False,
    record_in: str | None = None,
) -> subprocess.Popen:
    """Launch a benchmark in its own session (so a timeout can kill its whole group).

    ``unlimited_stack`` raises the child's stack limit (:func:`raise_stack_limit`) between
    fork and exec, so only the benchmark gets it, not this process. On Linux the child is
    killed when this process dies (see :func:`child_setup`). ``record_in``: a campaign's
    state dir, where the job's pid and start time are recorded (:func:`record_job`) so the
    next campaign kills what a killed one left running (:func:`kill_orphaned_jobs`)."""
    if not argv:
        raise ValueError("no command given to run")
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=child_setup(unlimited_stack),
        )
    except OSError as err:
        raise OSError(err.errno, f"cannot launch {argv[0]!r}: {err.strerror}") from None
    if record_in is not None:
        try:
            record_job(record_in, proc.pid)
        except OSError as err:  # the run goes on; only the clean-up after a crash is lost
            import logging

            logging.getLogger("hidvfs.native").warning(
                "event=job_record_failed dir=%s detail=%r", record_in, str(err)
            )
    return proc


# -- a record of the running benchmark, for the next campaign after a crash ------------------
_JOB_RECORD = "kernel-{owner}.json"


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat`` from field 3 (state) on; None when the pid is gone. The command
    name (field 2) may hold spaces and parentheses: the split starts after its last ``)``."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        return stat[stat.rindex(b")") + 2 :].split()
    except ValueError:
        return None


#: daemons that write the same cpufreq files (daemons.md 8; the unit's Conflicts= stops the
#: first three when systemd starts hidvfs, but not when they run outside systemd or hidvfs does)
RIVAL_DAEMONS = ("auto-cpufreq", "power-profiles-daemon", "tuned", "system76-power")
_INTERPRETERS = ("python", "python3", "perl", "sh", "bash")


def program_name(name: str, cmdline: list[str] | tuple[str, ...]) -> str:
    """The program a process runs: its script for an interpreter (``python3 /usr/sbin/tuned``
    is tuned), else its executable; ``name`` (``comm``, cut at 15 characters) when the
    command line does not read."""
    args = [a for a in cmdline if a]
    if not args:
        return name
    exe = os.path.basename(args[0])
    if exe.rstrip("0123456789.") in _INTERPRETERS:
        script = next((a for a in args[1:] if not a.startswith("-")), None)
        if script:
            return os.path.basename(script)
    return exe


def rival_daemons(rivals: tuple[str, ...] = RIVAL_DAEMONS) -> list[tuple[int, str]]:
    """(pid, name) of the running processes that are rival cpufreq daemons."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        info = proc.info
        prog = program_name(info.get("name") or "", info.get("cmdline") or ())
        if prog in rivals:
            found.append((int(info["pid"]), prog))
    return sorted(found)


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``); None where it does not read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _started(pid: int) -> int | None:
    f = _stat_fields(pid)
    return None if f is None or f[0] == b"Z" else int(f[19])


def record_job(state_dir: str, pid: int) -> str:
    """Write ``STATE_DIR/kernel-<this pid>.json``: the job's pid and start time (clock ticks
    since boot) and this process's, with the boot id. One file per campaign process, replaced
    at each run, removed by :func:`forget_job`."""
    import json

    owner = os.getpid()
    data = {
        "pid": int(pid),
        "start": _started(pid),
        "owner": owner,
        "owner_start": _started(owner),
        "boot_id": boot_id(),
    }
    from platforms.atomicfile import write_text_atomic
    from platforms.privatedir import private_dir

    private_dir(state_dir)  # another user's folder: root would write where it points
    # under a fresh mkstemp name (O_EXCL): a planted symlink is never followed
    return write_text_atomic(
        os.path.join(state_dir, _JOB_RECORD.format(owner=owner)), json.dumps(data)
    )


def forget_job(state_dir: str) -> None:
    """Remove this process's job record (the job is over and its group killed)."""
    try:
        os.unlink(os.path.join(state_dir, _JOB_RECORD.format(owner=os.getpid())))
    except OSError:
        pass


def kill_orphaned_jobs(state_dir: str) -> list[int]:
    """Kill what the campaigns that died left running, from their records in ``state_dir``,
    and remove those records; returns the pids killed.

    A record is acted on only when its campaign is gone (its pid absent or started at another
    time) and it is of this boot. Killed: the processes of the job's session (the job is its
    leader) started no earlier than the job, unless the job's pid now names another process
    (then the record is stale and nothing is killed)."""
    import glob
    import json
    import signal
    import stat

    from platforms.privatedir import check_private_dir

    if not os.path.lexists(state_dir):
        return []
    check_private_dir(state_dir)  # records another user planted must not pick what we kill
    killed: list[int] = []
    for path in sorted(glob.glob(os.path.join(glob.escape(state_dir), "kernel-*.json"))):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise ValueError(f"{path}: not a file of this user")
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
            pid, start = int(rec["pid"]), rec.get("start")
            owner, owner_start = int(rec["owner"]), rec.get("owner_start")
        except (OSError, ValueError, KeyError, TypeError):
            rec = None
        if rec is not None:
            if owner_start is not None and _started(owner) == owner_start:
                continue  # its campaign is still running
            leader = _stat_fields(pid)
            same_boot = rec.get("boot_id") == boot_id()
            reused = leader is not None and start is not None and int(leader[19]) != start
            if same_boot and start is not None and not reused:
                for entry in os.listdir("/proc"):
                    if not entry.isdigit():
                        continue
                    f = _stat_fields(int(entry))
                    if f is None or f[0] == b"Z" or int(f[3]) != pid or int(f[19]) < start:
                        continue
                    try:
                        os.kill(int(entry), signal.SIGKILL)
                        killed.append(int(entry))
                    except (ProcessLookupError, PermissionError):
                        pass
        try:
            os.unlink(path)
        except OSError:
            pass
    return killed


def exit_status(returncode: int) -> str:
    """``exit status N``, or the signal that killed the process, by name (a Popen
    returncode: negative for a signal)."""
    import signal

    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} ({-returncode})"
    return f"exit status {returncode}"


def kill_leftovers(proc: subprocess.Popen) -> bool:
    """Kill what a job that has exited left running in its process group (a background
    child); True when something was. The group id stays reserved while it has members, so
    the kill cannot reach another process."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_job(proc: subprocess.Popen) -> None:
    """Kill a job's whole process group (used past its timeout)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
