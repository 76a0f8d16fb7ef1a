"""Process control on a live board (psutil + the scheduler syscalls).

A job is its whole process tree: the registered pid and all its descendants, and every thread of
each (OpenMP workers are threads). CPU affinity and scheduling class are per thread on Linux,
so each tid is set on its own. A thread that exits meanwhile is skipped; a thread created while
we iterate inherits its creator's setting, and we re-list until no unseen tid appears. A pid
that has gone raises :class:`ProcessGone`; a refusal by the kernel becomes a PermissionError
that says which right is missing.
"""

from __future__ import annotations

import errno
import os
import subprocess

import psutil

from platforms import paths
from platforms.procs import ProcessControl, ProcessGone

#: how many times to re-list threads that appeared while we were setting the others
_MAX_PASSES = 4


def _denied(action: str, pid: int, err: BaseException) -> PermissionError:
    return PermissionError(
        errno.EPERM,
        f"{action} of pid {pid} was refused ({err}); the hidvfs daemon needs root "
        "(or CAP_SYS_NICE) to place and prioritise other users' processes",
    )


class LiveProcessControl(ProcessControl):
    def _root(self, pid: int) -> psutil.Process:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise ProcessGone(pid)
            return proc
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise ProcessGone(pid) from None

    def _tree(self, pid: int) -> list[psutil.Process]:
        root = self._root(pid)
        try:
            children = root.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise ProcessGone(pid) from None
        return [root, *children]

    def tids(self, pid: int) -> list[int]:
        """Every thread id of ``pid``'s process tree (the root's first)."""
        out: list[int] = []
        for i, proc in enumerate(self._tree(pid)):
            try:
                out.extend(t.id for t in proc.threads())
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                if i == 0:
                    raise ProcessGone(pid) from None
            except psutil.AccessDenied as err:
                raise _denied("listing the threads", proc.pid, err) from None
        return out

    @staticmethod
    def own_tids(pid: int) -> list[int]:
        """The thread ids of ``pid`` alone (``/proc/PID/task``: no scan of every process)."""
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{int(pid)}/task"))
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessGone(pid) from None

    def _each_thread(self, pid: int, action: str, apply, *, tree: bool = True) -> None:
        listing = self.tids if tree else self.own_tids
        done: set[int] = set()
        for _ in range(_MAX_PASSES):
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
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False
        except psutil.AccessDenied:
            return True

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
        return [(proc.pid, self.start_time(proc.pid)) for proc in self._tree(pid)[1:]]

    def cpu_time(self, pid: int) -> float:
        """User + system seconds of the live tree, plus what its reaped children used."""
        total = 0.0
        for i, proc in enumerate(self._tree(pid)):
            try:
                t = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                if i == 0:
                    raise ProcessGone(pid) from None
                continue
            except psutil.AccessDenied as err:
                raise _denied("reading the CPU time", proc.pid, err) from None
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
        try:
            with open(f"/proc/{int(pid)}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        try:  # the command name (field 2) may hold spaces and parentheses: split after it
            return float(stat[stat.rindex(b")") + 2 :].split()[19])
        except (ValueError, IndexError):
            return None

    def rt_allowed(self, pid: int) -> int:
        """Root's processes may take any priority; another user's only what its own
        RLIMIT_RTPRIO lets it set (the daemon must not hand out real-time priority)."""
        try:
            proc = psutil.Process(pid)
            if proc.uids().effective == 0:
                return 99
            soft, _hard = proc.rlimit(psutil.RLIMIT_RTPRIO)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, OSError):
            return 0
        return 99 if soft == psutil.RLIM_INFINITY else max(0, min(99, int(soft)))

    def machine_cpus(self) -> frozenset[int] | None:
        try:
            with open("/sys/devices/system/cpu/online", encoding="ascii") as f:
                return frozenset(paths.parse_cpu_ranges(f.read())) or None
        except (OSError, ValueError):
            return None

    def unmanageable(self, pid: int) -> str | None:
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
        """Real uid owning ``pid`` (None when it has gone)."""
        try:
            return psutil.Process(pid).uids().real
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None


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


def spawn(command: list[str]) -> subprocess.Popen:
    """Launch a job (``hidvfs run``); an unknown or non-executable command names itself."""
    if not command:
        raise ValueError("no command given to run")
    try:
        return subprocess.Popen(command)
    except OSError as err:
        raise OSError(err.errno, f"cannot launch {command[0]!r}: {err.strerror}") from None


def raise_stack_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_STACK to its hard limit (unlimited unless a lower hard
    limit forbids it), the ``ulimit -s unlimited`` some kernels need for their main thread's
    deep recursion; returns the previous (soft, hard) so a caller can put it back."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (old[1], old[1]))
    return old


def spawn_job(
    argv: list[str], env: dict[str, str], stdout, *, unlimited_stack: bool = False
) -> subprocess.Popen:
    """Launch a benchmark in its own session (so a timeout can kill its whole group).

    ``unlimited_stack`` raises the child's stack limit (:func:`raise_stack_limit`) between
    fork and exec, so only the benchmark gets it, not this process."""
    if not argv:
        raise ValueError("no command given to run")
    try:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=raise_stack_limit if unlimited_stack else None,
        )
    except OSError as err:
        raise OSError(err.errno, f"cannot launch {argv[0]!r}: {err.strerror}") from None


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
