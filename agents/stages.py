"""The decision stages after the hidvfs agents: the federated gate, the conformal shield, the spill.

Each stage is a callable ``(decision, observation) -> decision`` that only adds cores or raises
frequencies: :class:`GateStage` (the federated gate of :mod:`agents.gate`, rebuilt when the
scaling limits change), :class:`ShieldStage` (the split-conformal shield over each deadline
job's cluster frequency, fed by :mod:`agents.rtfeatures`) and :class:`SpillStage` (work
conservation: active cores the gate left unused go back to the jobs). They stand apart from
the agents (:mod:`agents.hidvfs`) because they never read the networks or the action space;
the mixed-criticality reservation (:mod:`agents.mixed`), the board trainer and the loaders
build them on their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from agents.deadlines import greedy_bound, span_within, work_at
from agents.features import job_remaining
from agents.gate import FederatedGate
from agents.policy import Decision, JobSetting
from agents.rtfeatures import rt_rows_many
from agents.schedulability import jobs_from_obs
from agents.shield import Shield
from platforms.observation import ClusterObs, JobObs, Observation

#: a response-time predictor ``x [N, in] -> y [N, out]`` (as :data:`agents.hidvfs.Net`)
Net = Callable[[np.ndarray], np.ndarray]


#: bounds of one job kept for the adaptive update: a job of hours at 100 ms would otherwise
#: keep tens of thousands and stall the loop when it ends (it is one update, whatever its count)
MAX_MARKS_PER_JOB = 64


class ShieldStage:
    """Post-posed conformal shield over each deadline job's cluster frequency.

    Candidates for a job are the allowed table entries of its cluster at or above the decided
    frequency (cost: the frequency); the predictor gives log response time, compared with the
    log of the remaining deadline (a monotone transform, so the conformal guarantee holds on
    the original scale). The cluster ends at the highest frequency any of its jobs needs.

    A job's bound (``last_bounds``) and its adaptive mark are those of the frequency it RUNS
    at, the cluster's final one: a later job on the same cluster may raise it past the one the
    job was certified at, and Gibbs-Candes scores the executed action (models.md 2.5.2). The
    raised frequency is one of the job's own candidates above its proposal, so its bound is at
    a fallback's share of alpha (the union bound over the job's candidates still sums to
    alpha) and may be above the certified one (a larger quantile). Its prediction is the
    job's own row at that frequency, already in the tick's single predictor call.
    """

    def __init__(self, predictor: Net, shield: Shield):
        self.predictor = predictor
        self.shield = shield
        self.last_bounds: dict[int, float] = {}
        #: with an adaptive calibrator (``update_job``): pid -> [(t, predicted log remaining s,
        #: q issued)] of the executed actions (the frequency each job ends the tick at), scored
        #: against the real response when the job ends
        self.pending: dict[int, list[tuple[float, float, float]]] = {}
        self.learns = hasattr(shield.calibrator, "update_job")

    def forget(self, pid: int) -> None:
        """The job left without an outcome (unregistered alive): its bounds cannot be scored."""
        self.pending.pop(pid, None)

    def job_done(self, pid: int, finish_t: float) -> int:
        """The job ended at ``finish_t``: score the bounds issued for it, each against the q it
        was issued with, in ONE Gibbs-Candes update (one err: did any miss; one score: the
        largest residual), the unit of the per-job calibration pool
        (:meth:`agents.shield.AdaptiveConformal.update_job`). Returns how many bounds were
        scored (0: none issued, no update)."""
        marks = self.pending.pop(pid, [])
        if marks:
            self.shield.calibrator.update_job(
                [math.log(max(finish_t - t, 1e-6)) for t, _, _ in marks],
                [pred for _, pred, _ in marks],
                [q for _, _, q in marks],
            )
        return len(marks)

    def calibration(self) -> dict | None:
        """The adaptive calibrator's state for the daemon's status (None when static)."""
        cal = self.shield.calibrator
        if not self.learns:
            return None
        return {
            "alpha": cal.alpha,
            "alpha_t": round(cal.alpha_now, 6),
            "updates": cal.t_,
            "miss_rate": None if not cal.t_ else round(cal.miss_rate, 6),
        }

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        self.last_bounds = {}
        dl = [j for j in obs.jobs if j.deadline_s is not None and j.profile is not None]
        if not dl:
            return decision
        out = decision.copy()
        # every (job, candidate) row in ONE predictor call: a row depends only on the job, its
        # cores and the candidate frequency (co-runners are scaled at the same frequency), and
        # the shield changes frequencies only, so raising one job's cluster leaves the other
        # rows exact; each job then sees the candidates at or above its cluster's current f
        home: dict[int, ClusterObs] = {}  # first cluster listing each CPU
        for cl in obs.clusters:
            for c in cl.cpus:
                home.setdefault(c, cl)
        plan = []
        for j in sorted(dl, key=lambda x: x.remaining_s):
            st = out.jobs.get(j.pid)
            if st is None or not st.cpus:
                continue
            cl = home.get(st.cpus[0])
            if cl is None:
                continue
            hi = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
            cur = out.freq_khz.get(cl.name, hi)
            cands = [f for f in cl.freqs_khz if cur <= f <= hi] or [cur]
            plan.append((j, st, cl, cands))
        if not plan:
            return decision
        X = rt_rows_many([(j, st, cl.capacity, cands) for j, st, cl, cands in plan], obs, out)
        pred = np.asarray(self.predictor(X), dtype=np.float64).reshape(-1).tolist()
        # the q(alpha_t) every bound of this tick is issued with (select's q0), kept with the
        # marks: alpha_t moves before the job ends, and err_t is for the set issued at t. A
        # Bonferroni fallback's bound (at alpha_t / K) is above it: a miss of it is one here.
        q_issue = self.shield.calibrator.q() if self.learns else math.nan
        start = 0
        # (pid, cluster, its candidates, its first row, row of its proposal, of the chosen f,
        # the chosen f, its bound U) of each job the shield selected for
        chosen = []
        for j, _, cl, cands in plan:
            cur = out.freq_khz.get(cl.name, cands[-1])
            k0 = next((k for k, f in enumerate(cands) if f >= cur), len(cands) - 1)
            sub = cands[k0:]
            rem = j.remaining_s
            if rem <= 0:
                res_f, ev = sub[-1], f"shield: pid {j.pid} past its deadline; maximum frequency"
                self.last_bounds[j.pid] = math.inf
            else:
                p_sub = pred[start + k0 : start + len(cands)]
                r = self.shield.select(sub, p_sub, math.log(rem), sub, 0, len(sub) - 1)
                res_f, ev = r.action, (r.event if r.intervened else "")
                chosen.append((j.pid, cl.name, cands, start, k0, k0 + r.index, res_f, r.upper_s))
            start += len(cands)
            if res_f != cur:
                out.freq_khz[cl.name] = res_f
                out.events.append(f"pid {j.pid} on {cl.name}: {ev} -> {res_f} kHz")
        # each job at the frequency it runs at (raised by a later job of its cluster or not):
        # its bound and its mark are the executed action's (class docstring)
        for pid, name, cands, first, k0, kr, res_f, upper in chosen:
            ran = out.freq_khz.get(name, cands[-1])
            if ran != res_f:  # raised: one of the job's fallbacks, bound at a fallback's share
                kr = next((k for k in range(kr, len(cands)) if cands[k] >= ran), len(cands) - 1)
                upper = pred[first + kr] + self.shield.fallback_q(len(cands) - k0)
            self.last_bounds[pid] = math.exp(upper) if math.isfinite(upper) else math.inf
            p_ran = pred[first + kr]
            if self.learns and math.isfinite(p_ran):
                marks = self.pending.setdefault(pid, [])
                marks.append((obs.t, p_ran, q_issue))
                if len(marks) > MAX_MARKS_PER_JOB:  # a long job: keep every other bound,
                    del marks[1::2]  # spread over its whole life
        return out


class SpillStage:
    """Work conservation after the gate and the shield: unused active cores are lent out.

    The gate hands each deadline job the fewest cores its federated analysis needs, inside one
    cluster, which can leave cores the profiler activated (or a whole cluster) without work.
    ``active()`` gives the profiler's active cores per cluster of this tick (clusters the
    thermal agent sent to cool have none, so they never receive work here). Those that no job
    uses go back to the jobs, cores only added, never removed:

    * inside a cluster that runs jobs: to its best-effort jobs if it has any, else to the
      deadline job of that cluster with the most remaining work (same cores, same frequency,
      so the gate's bound R <= L + (C - L)/n only improves with n' >= n; heavy cores stay
      exclusive because lent cores were unused);
    * a cluster that runs no job: to every best-effort job, else to the deadline job with the
      most remaining work, at the lowest table entry whose per-core speed (capacity x f) is at
      least the borrowers' home speed, so no task can run slower than on its home cores; a
      cluster that cannot match that speed lends its cores to a deadline job (at its top)
      only while the job holds its own cores alone and its bound for a greedy run on all of
      them, the slower ones included (:func:`agents.deadlines.greedy_bound`), still meets its
      deadline: slower cores shorten the work term and lengthen the span term.

    Before both: when a deadline job is late on the cores it has (the Graham bound of its
    remaining work there passes its remaining deadline), every free active core goes to the
    late job with the earliest deadline, whatever its cluster, and a cluster that runs no job
    then runs at its top OPP. A job already late loses nothing to slower borrowed cores, and
    every core it gets is one a best-effort job would otherwise have taken. With the gate on,
    its safest point already hands the free cores to the job short of cores, so this acts
    when the gate is off (the ablation).
    """

    def __init__(self, active: Callable[[], dict[str, tuple[int, ...]]] | None = None):
        self.active = active

    @staticmethod
    def _to_the_late(out: Decision, obs: Observation, act, where, jobs) -> bool:
        """Lend every free active core to the late deadline job with the earliest deadline
        (see the class docstring); False when no core is free or no job is late."""
        used = {c for st in out.jobs.values() for c in st.cpus}
        free = [
            (cl, c)
            for cl in obs.clusters
            for c in act.get(cl.name, ())
            if c in cl.online and c not in used
        ]
        if not free:
            return False
        late = []
        for pid, j in jobs.items():
            if j.deadline_s is None or j.profile is None or not j.remaining_s > 0:
                continue
            cpus = out.jobs[pid].cpus
            cl = where.get(cpus[0]) if cpus else None
            if cl is None:
                continue
            f = out.freq_khz.get(cl.name) or cl.cur_khz or cl.freqs_khz[-1]
            rem = job_remaining(j)
            c = work_at(j.profile, f, cl.capacity, rem)
            span = span_within(j.profile, f, cl.capacity, c)
            if span + (c - span) / len(cpus) > j.remaining_s:
                late.append((j.remaining_s, pid))
        if not late:
            return False
        pid = min(late)[1]
        for cl in {id(cl): cl for cl, _ in free}.values():
            if used.isdisjoint(cl.cpus):  # runs no job: at its top for the late one
                top = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
                out.freq_khz[cl.name] = top
        st = out.jobs[pid]
        out.jobs[pid] = JobSetting(
            tuple(sorted(set(st.cpus) | {c for _, c in free})), st.rt_priority, st.nice
        )
        return True

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        if not obs.jobs or not decision.jobs:
            return decision
        act = self.active() if self.active is not None else None
        if act is None:
            act = {c.name: tuple(sorted(c.online)) for c in obs.clusters}
        out = decision.copy()
        where = {c: cl for cl in obs.clusters for c in cl.cpus}
        jobs = {j.pid: j for j in obs.jobs if j.pid in out.jobs}
        if self._to_the_late(out, obs, act, where, jobs):
            return out

        def rem_work(j: JobObs) -> float:
            return job_remaining(j) * j.profile.work_s if j.profile is not None else 0.0

        def lend(pids, cores) -> None:
            for pid in pids:
                st = out.jobs[pid]
                out.jobs[pid] = JobSetting(
                    tuple(sorted(set(st.cpus) | set(cores))), st.rt_priority, st.nice
                )

        idle_clusters = []
        for cl in obs.clusters:
            mine = [c for c in act.get(cl.name, ()) if c in cl.online]
            if not mine:
                continue
            used = {c for st in out.jobs.values() for c in st.cpus}
            free = [c for c in mine if c not in used]
            if not free:
                continue
            here = [pid for pid, st in out.jobs.items() if set(st.cpus) & set(cl.cpus)]
            if not here:
                idle_clusters.append((cl, free))
                continue
            be = [pid for pid in here if jobs.get(pid) is not None and jobs[pid].deadline_s is None]
            if be:
                lend(be, free)
            else:
                dl = [pid for pid in here if pid in jobs and jobs[pid].profile is not None]
                if dl:
                    lend([max(dl, key=lambda p: (rem_work(jobs[p]), -p))], free)
        if not idle_clusters:
            return out
        best_effort = [pid for pid, j in jobs.items() if j.deadline_s is None]
        if best_effort:
            borrowers = best_effort
        else:
            dl = [pid for pid, j in jobs.items() if j.profile is not None]
            if not dl:
                return out
            borrowers = [max(dl, key=lambda p: (rem_work(jobs[p]), -p))]

        def home_speed(pid: int) -> float:
            st = out.jobs[pid]
            cl = where.get(st.cpus[0]) if st.cpus else None
            if cl is None:
                return 0.0
            f = out.freq_khz.get(cl.name) or cl.cur_khz or cl.freqs_khz[-1]
            return cl.capacity * f

        # before any lending: a core lent first must not stand for the borrower's home
        need = max(home_speed(pid) for pid in borrowers)
        for cl, free in idle_clusters:
            hi = cl.max_khz if cl.max_khz is not None else cl.freqs_khz[-1]
            lo = cl.min_khz if cl.min_khz is not None else 0
            allowed = [f for f in cl.freqs_khz if lo <= f <= hi] or [hi]
            ok = [f for f in allowed if cl.capacity * f >= need - 1e-6]
            if not ok and not best_effort:
                # slower than the deadline job's home: lent only while the bound of a greedy
                # run on all of its cores, the slower ones included, still meets its deadline
                pid = borrowers[0]
                if not self._slower_fit(out, jobs[pid], where, cl, allowed[-1], free):
                    continue
            out.freq_khz[cl.name] = ok[0] if ok else allowed[-1]
            lend(borrowers, free)
        return out

    @staticmethod
    def _slower_fit(out: Decision, j: JobObs, where, cl: ClusterObs, khz: int, free) -> bool:
        """Whether deadline job ``j`` still meets its deadline by :func:`greedy_bound` with
        ``free`` cores of ``cl`` at ``khz`` added to its own, which it must hold alone (a
        shared core's time is not the job's)."""
        if j.profile is None or not j.remaining_s > 0:
            return False
        mine = out.jobs[j.pid].cpus
        if not mine or any(
            pid != j.pid and not set(st.cpus).isdisjoint(mine) for pid, st in out.jobs.items()
        ):
            return False
        cores = []
        for c in mine:
            home = where.get(c)
            if home is None:
                return False
            f = out.freq_khz.get(home.name) or home.cur_khz or home.freqs_khz[-1]
            cores.append((f, home.capacity))
        cores += [(khz, cl.capacity)] * len(free)
        return greedy_bound(j.profile, cores, job_remaining(j)) <= j.remaining_s


class GateStage:
    """The federated gate as a decision stage (rebuilt when the scaling limits change).

    A few gates are kept, one per set of clusters seen: the mixed-criticality reservation
    runs the stage on its parts of the board every tick (:mod:`agents.mixed`)."""

    MAX_GATES = 8

    def __init__(self):
        self._gates: dict[tuple, FederatedGate] = {}
        self.last = None

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        key = tuple((c.name, c.online, c.min_khz, c.max_khz) for c in obs.clusters)
        gate = self._gates.get(key)
        if gate is None:
            if len(self._gates) >= self.MAX_GATES:
                self._gates.clear()
            gate = self._gates[key] = FederatedGate.from_observation(obs)
        jobs = jobs_from_obs(obs)
        if not jobs:
            return decision
        self.last = gate.repair(decision, jobs)
        return self.last.decision


__all__ = [
    "MAX_MARKS_PER_JOB",
    "ShieldStage",
    "SpillStage",
    "GateStage",
]
