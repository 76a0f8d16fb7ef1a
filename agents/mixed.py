"""Mixed criticality: cluster-aware reservation (models.md section 8).

A high-criticality job gets a whole cluster - its frequency domain included - for its lifetime:
its cores are exclusive, its priority is SCHED_FIFO, and the cluster never runs below the
frequency the job needs. Low-criticality jobs are confined to the other clusters and are the
first to slow down (their clusters keep the policy's choice). Reserving whole domains decouples
the HI job's DVFS from LO energy savings and removes shared-L2 interference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agents.policy import Decision, JobSetting, nearest_freq
from platforms.observation import ClusterObs, JobObs, Observation

HI_RT_PRIORITY = 50


def _speed(c: ClusterObs) -> float:
    return len(c.online) * c.capacity * (c.freqs_khz[-1] if c.freqs_khz else 0)


def needed_khz(job: JobObs, c: ClusterObs) -> int:
    """Lowest table frequency at which ``job`` still meets its deadline on all of ``c``.

    Uses the Graham bound of the remaining work with the two-point model; the top frequency
    when the job has no deadline or no profile.
    """
    top = c.freqs_khz[-1]
    p = job.profile
    if p is None or job.deadline_s is None:
        return top
    remaining = job.deadline_s - job.elapsed_s
    done = job.progress or 0.0
    frac = max(0.0, 1.0 - done)
    m = max(1, len(c.online))
    for f in c.freqs_khz:
        # seconds of compute at the reference point scale with ref/f and 1/capacity
        scale = (1.0 - p.beta) * (p.ref_khz / f) / c.capacity + p.beta
        work = p.work_s * scale * frac
        span = p.span_s * scale * frac
        if span + (work - span) / m <= remaining:
            return f
    return top


@dataclass
class ClusterReservation:
    """Decision stage: reserve one cluster per HI job; LO jobs go to the rest."""

    enabled: bool = True

    def __call__(self, decision: Decision, obs: Observation) -> Decision:
        if not self.enabled:
            return decision
        his = sorted(
            (j for j in obs.jobs if j.criticality == "hi"),
            key=lambda j: j.remaining_s if j.remaining_s is not None else math.inf,
        )
        if not his:
            return decision
        out = decision.copy()
        free = sorted(
            (c for c in obs.clusters if c.online and c.freqs_khz), key=_speed, reverse=True
        )
        reserved: dict[str, JobObs] = {}
        for j in his:
            if len(free) <= 1 and reserved:
                break  # keep one cluster for LO work once a HI job holds one
            if not free:
                break
            c = free.pop(0)
            reserved[c.name] = j
            out.jobs[j.pid] = JobSetting(tuple(c.online), rt_priority=HI_RT_PRIORITY)
            need = needed_khz(j, c)
            want = max(out.freq_khz.get(c.name, need), need)
            out.freq_khz[c.name] = nearest_freq(c.freqs_khz, want, "ceil")
            out.events.append(f"reserve cluster={c.name} pid={j.pid} need_khz={need}")
        lo_cpus = tuple(
            sorted(cpu for c in obs.clusters if c.name not in reserved for cpu in c.online)
        )
        # LO jobs keep the priorities the policy (and its gate) gave them on their own
        # clusters: a HI job's cores are exclusive, so they cannot reach it there
        keep_rt = bool(lo_cpus)
        if not lo_cpus:  # every cluster reserved: LO work shares the slowest one, below HI
            slowest = min((c for c in obs.clusters if c.online), key=_speed)
            lo_cpus = tuple(slowest.online)
        for j in obs.jobs:
            if j.criticality == "hi" and any(r.pid == j.pid for r in reserved.values()):
                continue
            prev = out.jobs.get(j.pid)
            cpus = tuple(c for c in (prev.cpus if prev else lo_cpus) if c in lo_cpus) or lo_cpus
            rt = prev.rt_priority if prev is not None and keep_rt else 0
            out.jobs[j.pid] = JobSetting(cpus, rt_priority=rt, nice=prev.nice if prev else 0)
        return out
