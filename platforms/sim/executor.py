"""Event-driven execution of DAG jobs on the board's cores, like an OpenMP task runtime.

Model (documented choices):

- A job has one worker thread per core it may use (its affinity ∩ online CPUs; if that is empty
  the kernel's fallback applies and it may use every online CPU). Idle threads take ready
  tasks (untied tasks: any of the job's threads may run any ready task). The ready pool is LIFO,
  as in work-first task runtimes, so recursive DAGs stay depth-first.
- A task of ``cycles`` reference cycles and ``mem_s`` seconds lasts
  ``cycles / (capacity · f) + mem_s`` on a core of its own. Progress is kept as the remaining
  fraction of the task, so a frequency change or a change of sharing re-times it exactly
  (compute and memory phases are treated as finely interleaved).
- Cores are shared between jobs by priority: a job with a higher priority (SCHED_FIFO rt
  priority; SCHED_OTHER is 0) evicts lower-priority tasks from a core (they go back to their
  job's ready pool with their progress, and run elsewhere or later), on release and whenever
  one of its tasks becomes ready, as a woken SCHED_FIFO thread preempts. Jobs of equal priority
  time-share a core by splitting its speed in proportion to their weights (CFS nice weights for
  SCHED_OTHER, equal for SCHED_FIFO): processor sharing, which is exact to simulate with events.
  When a core goes idle it takes a waiting job's task, or a task migrates to it from a shared
  core, so the schedule stays work-conserving.
- A job's ready task takes the biggest free core it may use (capacity order, set by the plant),
  as the kernel's capacity-aware placement moves a CPU-bound thread off a little core; on the
  boards here the lowest-numbered cores are the little ones. A running task is not migrated
  to a bigger core that frees up later (no misfit migration): it stays until it ends.
- Rare changes (affinity, priority, CPU online) re-dispatch every running task (progress is
  kept); a task whose core is still allowed to its job and not taken by a higher priority
  stays on it, as the kernel leaves a running thread where its new mask still holds it.

The hot path (a task completes, its job's thread takes the next ready task on the same core)
uses plain Python floats and lists and one ``heapq`` push/pop per task; stale heap entries are
skipped by a per-thread version number instead of being removed.

Per core the executor also keeps ``act`` (current switching activity), its integral ``acc`` and
the busy time, so the plant can integrate power exactly between its steps.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any


class _Thread:
    """A job's worker thread on one core, running one task."""

    __slots__ = ("job", "core", "task", "rem", "t_upd", "base", "dur", "share", "act", "ver")

    def __init__(self, job: ExecJob, core: int):
        self.job = job
        self.core = core
        self.task = -1
        self.rem = 1.0  # remaining fraction of the task at t_upd
        self.t_upd = 0.0
        self.base = 0.0  # task duration alone on the core at its current speed
        self.dur = 0.0  # task duration at the current share (base / share)
        self.share = 1.0
        self.act = 1.0
        self.ver = 0


class ExecJob:
    """Internal state of one released job (the public record is ``st``)."""

    __slots__ = (
        "st",
        "pid",
        "order",
        "n",
        "cyc",
        "mem",
        "ptr",
        "idx",
        "npred",
        "ready",
        "partial",
        "threads",
        "affinity",
        "allowed",
        "allowed_set",
        "prio",
        "weight",
        "work",
        "done_work",
        "total_work",
    )

    def __init__(
        self,
        st: Any,
        pid: int,
        order: int,
        cyc,
        mem,
        ptr,
        idx,
        npred,
        affinity,
        prio,
        weight,
        ref_hz: float,
    ):
        self.st = st
        self.pid = pid
        self.order = order
        self.n = len(cyc)
        self.cyc = cyc
        self.mem = mem
        self.ptr = ptr
        self.idx = idx
        self.npred = npred
        self.ready: list[int] = [i for i in range(self.n - 1, -1, -1) if npred[i] == 0]
        self.partial: dict[int, float] = {}
        self.threads: dict[int, _Thread] = {}
        self.affinity: tuple[int, ...] = tuple(affinity)
        self.allowed: tuple[int, ...] = ()
        self.allowed_set: frozenset[int] = frozenset()
        self.prio = prio
        self.weight = weight
        #: each task's seconds on a capacity-1 core at ``ref_hz``: the unit of JobProfile.work_s
        self.work = [c / ref_hz + m for c, m in zip(cyc, mem)]
        self.done_work = 0.0  # of the completed tasks
        self.total_work = sum(self.work)


class Executor:
    """Cores, jobs and the task-completion event heap."""

    def __init__(self, ncores: int, mem_activity: float, idle_activity: float, ref_hz: float = 1e9):
        self.n = ncores
        #: reference cycles per second of the work unit (:meth:`job_work_fraction`)
        self.ref_hz = float(ref_hz)
        self.mem_activity = mem_activity
        self.idle_activity = idle_activity
        self.inv_speed = [0.0] * ncores  # 1 / (capacity * f_hz), set by the plant
        #: the order a job's threads take free cores in (:meth:`set_core_order`)
        self.core_rank = list(range(ncores))
        self.online = [True] * ncores
        self.on_core: list[list[_Thread]] = [[] for _ in range(ncores)]
        self.free: set[int] = set(range(ncores))
        # power bookkeeping: activity now, its integral since the last take, segment start
        self.act = [idle_activity] * ncores
        self.acc = [0.0] * ncores
        self.seg = [0.0] * ncores
        self.busy_since = [0.0] * ncores
        self.busy_time = [0.0] * ncores
        # idle power-gating: an online core idle for gate_after[c] seconds is gated until it
        # next runs a thread; gated_time holds its closed gated stretches
        self.gate_after = [math.inf] * ncores
        self.idle_since = [0.0] * ncores
        self.gated_time = [0.0] * ncores
        self.heap: list[tuple[float, int, _Thread, int]] = []
        self._seq = itertools.count()
        self._order = itertools.count()
        self.jobs: dict[int, ExecJob] = {}
        self.waiting: set[ExecJob] = set()
        self.finished: list[Any] = []
        self.n_events = 0  # completed tasks (the benchmark's "task events")

    # ------------------------------------------------------------------------------------------
    # public operations

    def add_job(
        self, st, pid: int, cyc, mem, ptr, idx, npred, affinity, prio: int, weight: float, t: float
    ) -> None:
        job = ExecJob(
            st,
            pid,
            next(self._order),
            cyc,
            mem,
            ptr,
            idx,
            npred,
            affinity,
            prio,
            weight,
            self.ref_hz,
        )
        self._set_allowed(job)
        self.jobs[pid] = job
        if job.n == 0:
            self._finish(job, t)
            return
        self._fill(job, t)

    def next_time(self) -> float:
        """Time of the earliest pending task completion (stale entries dropped)."""
        heap = self.heap
        while heap and heap[0][2].ver != heap[0][3]:
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def run(self, t_limit: float) -> float | None:
        """Process task completions up to ``t_limit``.

        Returns the time of the first job completion (after processing every other event at
        that same instant), or None if no job completed before ``t_limit``.
        """
        heap = self.heap
        pop = heapq.heappop
        push = heapq.heappush
        seq = self._seq
        acc, act, seg = self.acc, self.act, self.seg
        inv_speed = self.inv_speed
        am = self.mem_activity
        free = self.free
        stop = None
        n_ev = 0
        while heap:
            ent = heap[0]
            t = ent[0]
            if t > t_limit:
                break
            pop(heap)
            thr = ent[2]
            if thr.ver != ent[3]:
                continue
            n_ev += 1
            job = thr.job
            st = job.st
            share = thr.share
            st.busy_s += (t - thr.t_upd) * share
            st.done_tasks += 1
            task = thr.task
            job.done_work += job.work[task]
            ready = job.ready
            npred = job.npred
            ptr = job.ptr
            for s in job.idx[ptr[task] : ptr[task + 1]]:
                k = npred[s] - 1
                npred[s] = k
                if not k:
                    ready.append(s)
            if ready:
                # fast path: this thread takes the next ready task on the same core
                nt = ready.pop()
                c = thr.core
                tc = job.cyc[nt] * inv_speed[c]
                me = job.mem[nt]
                base = tc + me
                a = (tc + am * me) / base if base > 0.0 else 1.0
                rem = job.partial.pop(nt, 1.0) if job.partial else 1.0
                thr.task = nt
                thr.rem = rem
                thr.t_upd = t
                thr.base = base
                thr.act = a
                if share == 1.0:
                    dur = base
                    acc[c] += act[c] * (t - seg[c])
                    seg[c] = t
                    act[c] = a
                else:
                    dur = base / share
                    self._core_act(c, t)
                thr.dur = dur
                push(heap, (t + rem * dur, next(seq), thr, thr.ver))
                if ready and (free or len(job.threads) < len(job.allowed)):
                    # more ready tasks: onto idle cores, and (as on release) onto the job's
                    # other allowed cores, evicting lower-priority tasks or time-sharing with
                    # equal ones. A woken SCHED_FIFO thread preempts at once; without this a
                    # lower-priority job kept those cores task after task (fast path above)
                    self._fill(job, t)
            else:
                self._leave(thr, t)
            if st.done_tasks == job.n:
                self._finish(job, t)
                stop = t
                t_limit = t
        self.n_events += n_ev
        return stop

    def set_speed(self, cores, inv_speed: float, t: float) -> None:
        """Cores got a new speed (frequency change): re-time their running tasks."""
        for c in cores:
            self.inv_speed[c] = inv_speed
            if self.on_core[c]:
                self._reshare(c, t)

    def set_core_order(self, cores) -> None:
        """Free cores are taken in this order (the plant gives the biggest cores first)."""
        for r, c in enumerate(cores):
            self.core_rank[c] = r
        for job in self.jobs.values():
            self._set_allowed(job)

    def set_gate_after(self, c: int, seconds: float) -> None:
        """Core ``c`` is power-gated once idle ``seconds`` (inf: never); an idle core counts
        as idle since long before t = 0 (a board that has been on for a while)."""
        self.gate_after[c] = seconds
        if not self.on_core[c] and math.isfinite(seconds):
            self.idle_since[c] = min(self.idle_since[c], -seconds)

    def is_gated(self, c: int, t: float) -> bool:
        """Core ``c`` is power-gated at ``t``: online, idle, for at least its gate_after."""
        return (
            self.online[c] and not self.on_core[c] and self.idle_since[c] + self.gate_after[c] <= t
        )

    def gated_total(self, c: int, t: float) -> float:
        """Cumulative power-gated seconds of core ``c`` since t = 0, up to ``t``."""
        if self.online[c] and not self.on_core[c]:
            return self.gated_time[c] + self._open_gated(c, t)
        return self.gated_time[c]

    def _open_gated(self, c: int, t: float) -> float:
        """Seconds of the idle core's current gated stretch up to ``t`` (counted from t = 0)."""
        start = self.idle_since[c] + self.gate_after[c]
        return t - max(start, 0.0) if start < t else 0.0

    def _close_gated(self, c: int, t: float) -> None:
        """Core ``c`` stops being idle (it runs, or goes offline): book its gated stretch."""
        self.gated_time[c] += self._open_gated(c, t)

    def set_online(self, c: int, online: bool, t: float) -> None:
        if self.online[c] == online:
            return
        self._flush_core(c, t)
        if not online and not self.on_core[c]:
            self._close_gated(c, t)
        self.online[c] = online
        if online:
            self.act[c] = self.idle_activity
            self.idle_since[c] = t
            self.free.add(c)
        else:
            busy = bool(self.on_core[c])
            for thr in list(self.on_core[c]):
                self._evict(thr, t)
            if busy:  # an idle core has no busy stretch to close (it would book a stale one)
                self._core_idle(c, t)
            self.act[c] = 0.0
            self.free.discard(c)
        for job in self.jobs.values():
            self._set_allowed(job)
        self._redispatch(t)

    def set_affinity(self, pid: int, cores, t: float) -> None:
        job = self.jobs.get(pid)
        if job is None:
            return
        job.affinity = tuple(cores)
        self._set_allowed(job)
        self._redispatch(t)

    def set_priority(self, pid: int, prio: int, weight: float, t: float) -> None:
        job = self.jobs.get(pid)
        if job is None or (job.prio == prio and job.weight == weight):
            return
        job.prio = prio
        job.weight = weight
        self._redispatch(t)

    def take_activity(self, t: float) -> list[float]:
        """∫ activity dt per core since the last call (power integration at plant steps)."""
        out = [a + b * (t - s) for a, b, s in zip(self.acc, self.act, self.seg)]
        n = self.n
        self.acc[:] = [0.0] * n
        self.seg[:] = [t] * n
        return out

    def busy_total(self, c: int, t: float) -> float:
        """Cumulative busy seconds of core ``c`` up to ``t``."""
        extra = t - self.busy_since[c] if self.on_core[c] else 0.0
        return self.busy_time[c] + extra

    def n_busy(self) -> int:
        return sum(1 for th in self.on_core if th)

    def job_cpu_time(self, pid: int, t: float) -> float | None:
        job = self.jobs.get(pid)
        if job is None:
            return None
        return job.st.busy_s + sum((t - th.t_upd) * th.share for th in job.threads.values())

    def job_work_fraction(self, pid: int, t: float) -> float | None:
        """Share of the running job's work done by ``t``: completed tasks, the done part of
        its running tasks and of those evicted mid-way (None when it is not running).

        Tasks weigh their time on a capacity-1 core at ``ref_hz``, as a job profile's work
        does, so ``1 - fraction`` is the remaining share of the work that profile counts.
        """
        job = self.jobs.get(pid)
        if job is None:
            return None
        if not job.total_work > 0.0:
            return 0.0
        done = job.done_work
        work = job.work
        for th in job.threads.values():
            rem = th.rem - (t - th.t_upd) / th.dur if th.dur > 0.0 else th.rem
            done += work[th.task] * (1.0 - min(max(rem, 0.0), 1.0))
        for task, rem in job.partial.items():
            done += work[task] * (1.0 - rem)
        return min(done / job.total_work, 1.0)

    def job_cores(self, pid: int) -> tuple[int, ...]:
        job = self.jobs.get(pid)
        return tuple(sorted(job.threads)) if job is not None else ()

    # ------------------------------------------------------------------------------------------
    # internals

    def _set_allowed(self, job: ExecJob) -> None:
        allowed = tuple(c for c in job.affinity if 0 <= c < self.n and self.online[c])
        if not allowed:  # the kernel's fallback: an empty online mask runs anywhere
            allowed = tuple(c for c in range(self.n) if self.online[c])
        job.allowed = tuple(sorted(allowed, key=self.core_rank.__getitem__))
        job.allowed_set = frozenset(allowed)

    def _flush_core(self, c: int, t: float) -> None:
        self.acc[c] += self.act[c] * (t - self.seg[c])
        self.seg[c] = t

    def _core_act(self, c: int, t: float) -> None:
        self._flush_core(c, t)
        self.act[c] = sum(th.share * th.act for th in self.on_core[c])

    def _core_idle(self, c: int, t: float) -> None:
        """Bookkeeping when core ``c`` has just lost its last thread."""
        self._flush_core(c, t)
        self.act[c] = self.idle_activity if self.online[c] else 0.0
        self.busy_time[c] += t - self.busy_since[c]
        self.idle_since[c] = t
        if self.online[c]:
            self.free.add(c)

    def _progress(self, thr: _Thread, t: float) -> None:
        """Account the thread's progress up to ``t`` at its current rate."""
        el = t - thr.t_upd
        if el > 0.0:
            thr.job.st.busy_s += el * thr.share
            if thr.dur > 0.0:
                rem = thr.rem - el / thr.dur
                thr.rem = rem if rem > 0.0 else 0.0
            else:
                thr.rem = 0.0
        thr.t_upd = t

    def _reshare(self, c: int, t: float) -> None:
        """Recompute shares and durations of every thread on core ``c`` and re-time them."""
        threads = self.on_core[c]
        for thr in threads:
            self._progress(thr, t)
        total_w = sum(th.job.weight for th in threads)
        inv = self.inv_speed[c]
        am = self.mem_activity
        push = heapq.heappush
        for thr in threads:
            job = thr.job
            thr.share = 1.0 if len(threads) == 1 else job.weight / total_w
            tc = job.cyc[thr.task] * inv
            me = job.mem[thr.task]
            base = tc + me
            thr.base = base
            thr.act = (tc + am * me) / base if base > 0.0 else 1.0
            thr.dur = base / thr.share
            thr.ver += 1
            push(self.heap, (t + thr.rem * thr.dur, next(self._seq), thr, thr.ver))
        self._core_act(c, t)

    def _evict(self, thr: _Thread, t: float) -> None:
        """Take the thread's task off its core, back to the job's ready pool with its progress."""
        self._progress(thr, t)
        job = thr.job
        if thr.rem < 1.0:
            job.partial[thr.task] = thr.rem
        job.ready.append(thr.task)
        self.on_core[thr.core].remove(thr)
        del job.threads[thr.core]
        thr.ver += 1

    def _place(self, job: ExecJob, c: int, t: float) -> list[ExecJob]:
        """Start a new thread of ``job`` on core ``c`` with its next ready task.

        Returns the jobs whose tasks were evicted (lower priority) so the caller can refill them.
        """
        evicted: list[ExecJob] = []
        others = self.on_core[c]
        if others and others[0].job.prio < job.prio:
            for thr in list(others):
                evicted.append(thr.job)
                self._evict(thr, t)
            self._core_idle(c, t)
        st = job.st
        if st.start_t is None:
            st.start_t = t
        thr = _Thread(job, c)
        job.threads[c] = thr
        task = job.ready.pop()
        thr.task = task
        thr.rem = job.partial.pop(task, 1.0) if job.partial else 1.0
        thr.t_upd = t
        if not others:
            self.free.discard(c)
            self.busy_since[c] = t
            self._close_gated(c, t)
        others.append(thr)
        self._reshare(c, t)
        return evicted

    def _contended_core(self, job: ExecJob) -> int | None:
        """Best allowed core already in use: lower priority first (evict), then fewest threads."""
        best, best_key = None, None
        for c in job.allowed:
            if c in job.threads:
                continue
            th = self.on_core[c]
            if not th:
                return c
            p = th[0].job.prio
            if p > job.prio:
                continue
            key = (p == job.prio, len(th), c)
            if best_key is None or key < best_key:
                best, best_key = c, key
        return best

    def _fill(self, job: ExecJob, t: float) -> None:
        """Place the job's ready tasks on idle cores first, then on shareable/evictable ones."""
        ready = job.ready
        free = self.free
        evicted: list[ExecJob] = []
        while ready:
            c = -1
            for x in job.allowed:
                if x in free:
                    c = x
                    break
            if c < 0:
                cc = self._contended_core(job)
                if cc is None:
                    self.waiting.add(job)
                    break
                c = cc
            evicted.extend(self._place(job, c, t))
        else:
            self.waiting.discard(job)
        for other in sorted(set(evicted), key=lambda j: (-j.prio, j.order)):
            if other.pid in self.jobs:
                self._fill(other, t)

    def _leave(self, thr: _Thread, t: float) -> None:
        """The thread's job has no ready task for it: it leaves its core."""
        c = thr.core
        threads = self.on_core[c]
        threads.remove(thr)
        del thr.job.threads[c]
        thr.ver += 1
        if threads:
            self._reshare(c, t)
            return
        self._core_idle(c, t)
        self._rebalance(c, t)

    def _rebalance(self, c: int, t: float) -> None:
        """Core ``c`` went idle: give it to a waiting job, or migrate a task from a shared core."""
        if self.waiting:
            cands = [j for j in self.waiting if j.ready and c in j.allowed_set]
            self.waiting = {j for j in self.waiting if j.ready}
            if cands:
                job = max(cands, key=lambda j: (j.prio, -j.order))
                self._place(job, c, t)
                if not job.ready:
                    self.waiting.discard(job)
                return
        if len(self.jobs) > 1:
            for c2 in range(self.n):
                th = self.on_core[c2]
                if len(th) > 1:
                    for thr in th:
                        job = thr.job
                        if c in job.allowed_set and c not in job.threads:
                            self._evict(thr, t)
                            self._reshare(c2, t)
                            self._place(job, c, t)
                            return

    def _redispatch(self, t: float) -> None:
        """Evict every running task and place them again (rare: affinity/priority/online).

        A task goes back to the core it ran on when that core is still allowed to its job
        and no higher-priority task took it first, as the kernel leaves a running thread on
        its CPU when a new affinity mask still holds it; only the others are placed anew."""
        ran: dict[int, list[tuple[int, int]]] = {}
        for c in range(self.n):
            if self.on_core[c]:
                for thr in list(self.on_core[c]):
                    ran.setdefault(thr.job.pid, []).append((c, thr.task))
                    self._evict(thr, t)
                self._core_idle(c, t)
        self.free.clear()
        self.free.update(c for c in range(self.n) if self.online[c])
        self.waiting = set()
        for job in sorted(self.jobs.values(), key=lambda j: (-j.prio, j.order)):
            for c, task in ran.get(job.pid, ()):
                if c not in job.allowed_set or c in job.threads:
                    continue
                others = self.on_core[c]
                if others and others[0].job.prio != job.prio:
                    continue  # a higher-priority job holds it now
                job.ready.remove(task)
                job.ready.append(task)  # _place takes the last ready task
                self._place(job, c, t)
            if job.ready:
                self._fill(job, t)

    def _finish(self, job: ExecJob, t: float) -> None:
        del self.jobs[job.pid]
        self.waiting.discard(job)
        st = job.st
        st.finish_t = t
        if st.start_t is None:
            st.start_t = t
        self.finished.append(st)
