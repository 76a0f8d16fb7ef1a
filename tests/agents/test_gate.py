"""Federated gate: hand-checked allocations and properties against a brute-force search."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agents.deadlines import work_at
from agents.gate import FederatedGate, default_cost, gate_decision, order_priorities
from agents.gate_repair import _Repair
from agents.policy import Decision, JobSetting
from agents.schedulability import (
    LIGHT,
    Assignment,
    GateCluster,
    GateJob,
    _analyse,
    analyse,
    clusters_from_obs,
    edf_fits,
    feasible,
    jobs_from_obs,
    light_partition,
    light_pool_size,
    min_cores,
    pool_fits,
    requirement,
    requirements,
)
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation
from platforms.spec import load_board

GHZ = 1_000_000


def prof(work, span, beta=0.0, ref=GHZ, name="j"):
    return JobProfile(name, work, span, beta, work, ref, 1)


def cl(name, cpus, table, capacity=1.0):
    return GateCluster(name, tuple(cpus), tuple(table), capacity)


# ---------------------------------------------------------------------------------- formulas


def test_min_cores_matches_the_federated_formula():
    p = prof(4.0, 1.0)
    assert min_cores(p, GHZ, 1.0, 2.0) == 3  # ceil((4 - 1) / (2 - 1))
    assert min_cores(p, GHZ, 1.0, 2.5) == 2  # ceil(3 / 1.5)
    assert min_cores(p, GHZ, 1.0, 4.0) == 1  # C <= D: light, one sequential core
    assert min_cores(p, GHZ, 1.0, 1.0) is None  # L >= D: no core count helps
    # compute-bound: twice the frequency halves C and L -> light at D = 2
    assert min_cores(p, 2 * GHZ, 1.0, 2.0) == 1
    # a core of capacity 2 at f_ref is the same as f = 2 f_ref
    assert min_cores(p, GHZ, 2.0, 1.5) == min_cores(p, 2 * GHZ, 1.0, 1.5) == 2
    # memory-bound half: at half frequency phi = 0.5 * 2 + 0.5 = 1.5 -> C = 6. The span's
    # path may be all compute: without its parts L(f) = L * f_ref / f = 2
    q = prof(4.0, 1.0, beta=0.5)
    assert min_cores(q, GHZ // 2, 1.0, 2.5) == math.ceil((6 - 2) / (2.5 - 2))
    # ... with them (a path of 0.5 s compute and one of 0.5 s memory): L(f) = 0.5 * 2 + 0.5
    q2 = dataclasses.replace(q, span_cpu_s=0.5, span_mem_s=0.5)
    assert min_cores(q2, GHZ // 2, 1.0, 2.5) == math.ceil((6 - 1.5) / (2.5 - 1.5))
    # frequency cannot fix memory-bound lateness: beta * L >= D at any f
    assert min_cores(q, 100 * GHZ, 1.0, 0.5) is None
    # half the work left: C = 2, L = min(1, 2) = 1
    assert min_cores(p, GHZ, 1.0, 1.5, remaining=0.5) == 2


def test_edf_list_test_and_light_pool_size():
    assert edf_fits([(1.0, 0.6), (2.0, 1.2)], 1)  # 0.6 <= 1, 1.8 <= 2
    assert not edf_fits([(1.0, 0.6), (2.0, 1.5)], 1)  # 2.1 > 2
    assert edf_fits([(1.0, 0.6), (2.0, 1.5)], 2)
    # a shared pool: (deadline, C, L); a job may spread over every core of it
    assert light_pool_size([(1.0, 0.6, 0.6), (2.0, 1.2, 1.2)], 4) == 1
    assert light_pool_size([(1.0, 0.6, 0.6), (2.0, 1.5, 1.5)], 4) == 2  # 1.5 + 0.6 / 2
    assert light_pool_size([(1.0, 0.6, 0.6), (2.0, 1.5, 1.5)], 1) is None
    # equal deadlines count each other's work: 0.9 + (0.5 + 0.9 + 0.9 - 0.9) / 3 > 1
    assert light_pool_size([(1.0, 0.5, 0.5), (1.0, 0.9, 0.9), (1.5, 0.9, 0.9)], 3) is None


def test_a_shared_pool_counts_a_parallel_higher_priority_job_on_every_core():
    """A parallel job first in deadline order holds both cores of the pool until it ends
    (2 s); a chain of 3.5 s behind it ends at 5.5 s, past its 4.1 s. The list schedule of
    one core per job (3.5 s) is not what runs in a shared pool."""
    jobs = [(4.05, 4.0, 0.01), (4.1, 3.5, 3.5)]
    assert edf_fits([(d, c) for d, c, _ in jobs], 2)  # the per-core list: fits
    assert not pool_fits(jobs, 2) and light_pool_size(jobs, 2) is None
    assert light_partition([(d, c) for d, c, _ in jobs], 2) == [[0], [1]]  # pinned: fits


def test_default_cost_is_monotone():
    k = cl("a", (0,), (GHZ,), 1.9)
    assert default_cost(k, GHZ, 2) == pytest.approx(2 * 1.9)
    assert default_cost(k, 2 * GHZ, 1) == pytest.approx(8 * 1.9)


# ---------------------------------------------------------------------------------- repair


QUAD = cl("big", (0, 1, 2, 3), (GHZ, 1_500_000, 2 * GHZ))


def test_feasible_proposal_is_returned_unchanged():
    job = GateJob(10, prof(4.0, 0.5), 1.5)  # at 1 GHz: n = ceil(3.5 / 1.0) = 4
    d = Decision({"big": GHZ}, {10: JobSetting((0, 1, 2, 3))})
    r = FederatedGate([QUAD]).repair(d, [job])
    assert r.feasible and r.decision is d and r.events == []
    assert r.alloc[10].kind == "heavy" and r.alloc[10].need == 4


def test_repair_takes_the_cheapest_of_more_cores_or_higher_frequency():
    job = GateJob(10, prof(4.0, 0.5), 1.5)
    d = Decision({"big": GHZ}, {10: JobSetting((0, 1))})
    # default cost: 4 cores at 1 GHz (4) < 2 cores at 1.5 GHz (6.75) < 2 cores at 2 GHz (16)
    r = FederatedGate([QUAD]).repair(d, [job])
    assert r.feasible
    assert r.decision.freq_khz == {"big": GHZ} and r.decision.jobs[10].cpus == (0, 1, 2, 3)
    assert any("cores [0, 1] -> [0, 1, 2, 3]" in e for e in r.events)
    # a cost model where cores are dear prefers raising the frequency one OPP
    dear_cores = FederatedGate([QUAD], cost=lambda k, khz, n: 100 * n + khz / GHZ)
    r = dear_cores.repair(d, [job])
    # at 1.5 GHz: C = 8/3, L = 1/3 -> n = ceil((7/3) / (1.5 - 1/3)) = 2
    assert r.decision.freq_khz == {"big": 1_500_000} and r.decision.jobs[10].cpus == (0, 1)
    assert any("big 1000000 -> 1500000 kHz" in e for e in r.events)


def test_repair_only_raises_frequency_and_keeps_fine_clusters_untouched():
    little = cl("little", (4, 5), (GHZ, 2 * GHZ))
    ok_job = GateJob(1, prof(1.0, 1.0), 5.0)  # light on little
    late = GateJob(2, prof(4.0, 0.5), 1.5)
    d = Decision(
        {"big": 1_500_000, "little": 2 * GHZ},
        {1: JobSetting((4, 5), rt_priority=0, nice=5), 2: JobSetting((0, 1), rt_priority=30)},
    )
    r = FederatedGate([QUAD, little]).repair(d, [ok_job, late])
    assert r.feasible
    assert r.decision.freq_khz["little"] == 2 * GHZ and r.decision.jobs[1] == d.jobs[1]
    assert r.decision.freq_khz["big"] >= 1_500_000
    assert r.decision.jobs[2].rt_priority == 30  # priority kept, only cores changed
    assert set(r.decision.jobs[2].cpus) <= set(QUAD.cpus)


def test_job_spanning_clusters_is_moved_into_one_and_best_effort_leaves_heavy_cores():
    little = cl("little", (4, 5), (GHZ, 2 * GHZ))
    job = GateJob(1, prof(4.0, 0.5), 1.5)
    d = Decision(
        {"big": GHZ, "little": GHZ},
        {1: JobSetting((0, 1, 2, 4, 5)), 99: JobSetting((0, 1, 2, 3, 4, 5))},
    )
    r = FederatedGate([QUAD, little]).repair(d, [job])
    assert r.feasible
    heavy = set(r.decision.jobs[1].cpus)
    assert heavy <= set(QUAD.cpus) or heavy <= set(little.cpus)
    assert heavy.isdisjoint(r.decision.jobs[99].cpus) and r.decision.jobs[99].cpus
    assert any("best effort" in e for e in r.events)


def test_infeasible_gives_the_safest_point():
    little = cl("little", (4, 5), (GHZ, 2 * GHZ), capacity=0.5)
    hopeless = GateJob(1, prof(40.0, 5.0), 1.5)  # L(2 GHz) = 2.5 > D
    d = Decision({"big": GHZ, "little": GHZ}, {1: JobSetting((4,))}, governor={"big": "schedutil"})
    r = FederatedGate([QUAD, little]).repair(d, [hopeless])
    assert not r.feasible
    assert r.decision.freq_khz == {"big": 2 * GHZ, "little": 2 * GHZ}
    assert r.decision.governor == {}
    # the largest/fastest cluster, then (no other job needs them) the other free cores
    assert any("gets all 4 free cores of big" in e for e in r.events)
    assert set(r.decision.jobs[1].cpus) == set(QUAD.cpus) | {4, 5}
    assert any("no feasible assignment" in e for e in r.events)
    assert r.events[0] in r.decision.events


def test_the_job_short_of_cores_gets_the_free_cores_not_a_best_effort_job():
    """At the safest point a best-effort job used to get the cores no deadline job held (a
    prime core, say) while a deadline job sat short on another cluster. Now the short job
    gets them; the best-effort job shares its spare cores, below it, and never the cores of
    a job that can still make its deadline."""
    little = cl("little", (4, 5), (GHZ, 2 * GHZ), capacity=0.5)
    prime = cl("prime", (6,), (GHZ, 2 * GHZ), capacity=1.5)
    on_time = GateJob(1, prof(8.0, 1.0), 2.0)  # 3 cores of big at 2 GHz
    short = GateJob(2, prof(16.0, 1.0), 2.5)  # fits on no cluster's free cores
    every = tuple(range(7))
    d = Decision(
        {"big": GHZ, "little": GHZ, "prime": GHZ},
        {1: JobSetting(every, 80), 2: JobSetting(every, 85), 3: JobSetting(every, 90)},
    )
    r = FederatedGate([QUAD, little, prime]).repair(d, [on_time, short])
    assert not r.feasible
    st = r.decision.jobs
    assert len(st[1].cpus) == 3 and set(st[1].cpus) <= set(QUAD.cpus)
    assert set(st[2].cpus) == set(every) - set(st[1].cpus)  # prime, then every spare core
    assert st[3].cpus and set(st[3].cpus).isdisjoint(st[1].cpus) and 6 not in st[3].cpus
    assert st[3].rt_priority == 0 < st[2].rt_priority
    assert any("pid 2 cannot meet its deadline" in e for e in r.events)


def test_safest_point_serves_savable_jobs_before_a_lost_one():
    """A job past its deadline sorts first by deadline, but cores it takes cannot save it:
    the others go first in deadline order (the one short of cores takes what is free) and
    the lost job gets what is left."""
    lost = GateJob(1, prof(4.0, 1.0), -0.01)
    heavy = GateJob(2, prof(8.0, 1.0), 2.0)  # at 2 GHz: C = 4, L = 0.5: ceil(3.5 / 1.5) = 3
    short = GateJob(3, prof(8.0, 1.0), 2.5)  # needs 2 cores at 2 GHz, 1 is left then
    d = Decision({"big": GHZ}, {p: JobSetting(QUAD.cpus) for p in (1, 2, 3)})
    r = FederatedGate([QUAD]).repair(d, [short, heavy, lost])
    assert not r.feasible
    assert r.decision.freq_khz == {"big": 2 * GHZ}
    got = {p: set(r.decision.jobs[p].cpus) for p in (1, 2, 3)}
    assert len(got[2]) == 3 and len(got[3]) == 1 and got[2].isdisjoint(got[3])
    assert got[1] == set(QUAD.cpus)  # nothing free: the lost job shares, it takes nothing
    assert any("pid 3 cannot meet its deadline" in e for e in r.events)


def test_light_partition_finds_the_split_the_list_misses():
    # equal deadlines: the list runs the shorter job first and the longer one ends at 2.5;
    # the longer one alone on the second core fits
    jobs = [(1.0, 0.8), (2.0, 0.8), (2.0, 1.7)]
    assert not edf_fits(jobs, 2)
    assert light_partition(jobs, 2) == [[0, 1], [2]]
    assert light_partition(jobs, 1) is None
    assert light_partition([], 0) == [] and light_partition(jobs, 0) is None


def test_gate_splits_light_jobs_over_cores_when_only_a_split_fits():
    two = cl("two", (1, 2), (400_000,), capacity=1.5)  # 0.6 of the reference speed
    jobs = [
        GateJob(100, prof(1.0, 1.0), 1.0, 0.5),  # C = 0.83, sequential
        GateJob(101, prof(1.0, 1.0), 2.0, 0.5),  # C = 0.83
        GateJob(102, prof(1.0, 1.0), 2.0, 1.0),  # C = 1.67
    ]
    r = FederatedGate([two]).repair(Decision({"two": 400_000}, {}), jobs)
    assert r.feasible
    cpus = {p: r.decision.jobs[p].cpus for p in (100, 101, 102)}
    assert cpus[100] == cpus[101] and len(cpus[100]) == 1 and set(cpus[102]).isdisjoint(cpus[100])
    # the two on one core run in deadline order
    assert r.decision.jobs[100].rt_priority > r.decision.jobs[101].rt_priority >= 1


def test_a_best_effort_job_runs_below_the_deadline_job_whose_cores_it_shares():
    """The priority agent may rank a best-effort job first; on a light job's core it would
    take the core, and the light job would wait past its deadline."""
    light = GateJob(1, prof(0.5, 0.1), 1.0)
    d = Decision({"big": GHZ}, {1: JobSetting((0,), 85), 2: JobSetting(QUAD.cpus, 90, 5)})
    r = FederatedGate([QUAD]).repair(d, [light])
    assert r.feasible and r.decision.jobs[1].cpus == (0,)
    assert r.decision.jobs[2] == JobSetting(QUAD.cpus, 0, 5)  # SCHED_OTHER, nice kept
    assert r.decision.jobs[1].rt_priority == 85
    assert r.events == ["gate: pid 2 rt priority 0 (best effort on the cores of deadline pid 1)"]
    # a deadline job at SCHED_OTHER becomes SCHED_FIFO above it
    d = Decision({"big": GHZ}, {1: JobSetting((0,), 0), 2: JobSetting(QUAD.cpus, 0)})
    r = FederatedGate([QUAD]).repair(d, [light])
    assert r.decision.jobs[1].rt_priority == 1 and r.decision.jobs[2].rt_priority == 0


def test_the_safest_point_s_sharer_runs_below_the_holders():
    holder = GateJob(1, prof(4.0, 1.0), 2.0)  # at 2 GHz: C = 2 <= D: light, one core
    sharer = GateJob(2, prof(40.0, 0.1), 2.0)  # needs more than the board: the 3 left
    lost = GateJob(3, prof(4.0, 1.0), -0.1)  # past its deadline: shares the whole cluster
    # the lost job proposed above the others: it would take their cores
    d = Decision({"big": GHZ}, {p: JobSetting(QUAD.cpus, 80 + p) for p in (1, 2, 3)})
    r = FederatedGate([QUAD]).repair(d, [holder, sharer, lost])
    assert not r.feasible
    st = r.decision.jobs
    assert st[3].cpus == QUAD.cpus and st[3].rt_priority < min(st[1].rt_priority, 82)
    for inner, outer in itertools.permutations((1, 2, 3), 2):
        if set(st[inner].cpus) < set(st[outer].cpus):
            assert st[inner].rt_priority > st[outer].rt_priority >= 1


def test_raising_a_kernel_governed_cluster_hands_it_to_userspace():
    job = GateJob(10, prof(4.0, 0.5), 1.5)
    d = Decision({"big": GHZ}, {10: JobSetting((0, 1))}, governor={"big": "ondemand"})
    r = FederatedGate([QUAD], cost=lambda k, khz, n: 100 * n + khz / GHZ).repair(d, [job])
    assert r.decision.governor == {} and any("userspace" in e for e in r.events)


def test_light_jobs_share_a_pool_sized_by_the_edf_test():
    jobs = [GateJob(1, prof(0.6, 0.1), 1.0), GateJob(2, prof(1.5, 0.1), 2.0)]
    d = Decision({"big": GHZ}, {})
    r = FederatedGate([QUAD]).repair(d, jobs)
    assert r.feasible
    # one core at 1 GHz misses (0.6 + 1.5 > 2); two at 1 GHz (cost 2) beat one at 1.5 GHz (3.375)
    assert r.decision.freq_khz["big"] == GHZ
    assert r.decision.jobs[1].cpus == r.decision.jobs[2].cpus and len(r.decision.jobs[1].cpus) == 2
    assert r.alloc[1].kind == r.alloc[2].kind == "light" and r.alloc[1].need == 2
    # when cores are dear, one core at 1.5 GHz runs both in deadline order (0.4, then 1.4 <= 2)
    r = FederatedGate([QUAD], cost=lambda k, khz, n: 100 * n + khz / GHZ).repair(d, jobs)
    assert r.decision.freq_khz["big"] == 1_500_000 and len(r.decision.jobs[1].cpus) == 1


def test_observation_adapters():
    c = ClusterObs(
        "a57",
        0,
        (0, 3, 4, 5),
        (0, 3),
        (345600, 960000, 1420800, 2035200),
        1.0,
        960000,
        400000,
        1500000,
        "userspace",
    )
    prof_ = prof(2.0, 1.0)
    jobs = (
        JobObs(1, "a", "hi", 0.0, 1.0, 4.0, profile=prof_, progress=0.25),
        JobObs(2, "b", "lo", 0.0, 1.0, None, profile=prof_),
        JobObs(3, "c", "lo", 0.0, 1.0, 3.0),
    )
    obs = Observation(0.0, "tx2", (c,), (), (), jobs)
    (k,) = clusters_from_obs(obs)
    assert k.cpus == (0, 3) and k.freqs_khz == (960000, 1420800)
    (g,) = jobs_from_obs(obs)
    assert g.pid == 1 and g.remaining_s == 3.0 and g.remaining_work == pytest.approx(0.75)
    r = gate_decision(obs, Decision({"a57": 960000}, {1: JobSetting((0,))}))
    assert r.feasible and r.decision.freq_khz["a57"] in k.freqs_khz


# ---------------------------------------------------------------------------------- properties

TABLE_CHOICES = (400_000, 800_000, 1_200_000, 1_600_000, 2_000_000)


@st.composite
def instances(draw, max_cpus=2):
    nk = draw(st.integers(2, 3))
    clusters, cpu = [], 0
    for i in range(nk):
        m = draw(st.integers(1, max_cpus))
        table = tuple(sorted(draw(st.sets(st.sampled_from(TABLE_CHOICES), min_size=1, max_size=3))))
        cap = draw(st.sampled_from((0.5, 1.0, 1.5)))
        clusters.append(cl(f"c{i}", range(cpu, cpu + m), table, cap))
        cpu += m
    jobs = []
    for j in range(draw(st.integers(1, 3))):
        work = draw(st.floats(0.2, 6.0))
        span = work * draw(st.floats(0.05, 1.0))
        beta = draw(st.sampled_from((0.0, 0.2, 0.5)))
        d = draw(st.floats(0.1, 6.0))
        rem = draw(st.sampled_from((1.0, 0.5)))
        jobs.append(GateJob(100 + j, prof(work, span, beta, name=f"j{j}"), d, rem))
    freq = {k.name: draw(st.sampled_from(k.freqs_khz + (1_000_000,))) for k in clusters}
    cpus = list(range(cpu))
    settings_ = {}
    for j in jobs:
        s = draw(st.sets(st.sampled_from(cpus), max_size=len(cpus)))
        if s:
            settings_[j.pid] = JobSetting(tuple(sorted(s)))
    return tuple(clusters), tuple(jobs), Decision(freq, settings_)


def core_options(clusters):
    """Every non-empty core set inside one cluster."""
    out = []
    for k in clusters:
        for r in range(1, len(k.cpus) + 1):
            out.extend(itertools.combinations(k.cpus, r))
    return out


def brute_force_exists(clusters, jobs, all_freqs=True, room=False):
    """Is there ANY frequency vector and core assignment that :func:`feasible` accepts?

    ``room``: best-effort jobs exist too, so some online core must stay outside the heavy
    reservations (they may share every other core).
    """
    online = {c for k in clusters for c in k.cpus}
    options = core_options(clusters)
    freq_vectors = (
        itertools.product(*(k.freqs_khz for k in clusters))
        if all_freqs
        else [tuple(k.freqs_khz[-1] for k in clusters)]
    )
    for fv in freq_vectors:
        freq = {k.name: f for k, f in zip(clusters, fv)}
        for combo in itertools.product(options, repeat=len(jobs)):
            a = Assignment(clusters, jobs, freq, {j.pid: c for j, c in zip(jobs, combo)})
            reasons, alloc = analyse(a)
            if reasons:
                continue
            heavy = {c for al in alloc.values() if al.kind == "heavy" for c in al.cpus}
            if not room or heavy != online:
                return True
    return False


def check_priorities(jobs, decision):
    """The priorities the analysis assumes hold on every shared core (order_priorities)."""
    due = {j.pid: i for i, j in enumerate(sorted(jobs, key=lambda j: (j.remaining_s, j.pid)))}
    st = decision.jobs
    for a, b in itertools.permutations(st, 2):
        ca, cb = set(st[a].cpus), set(st[b].cpus)
        if ca.isdisjoint(cb):
            continue
        if a in due and b not in due:  # a best-effort job never runs above a deadline one
            assert st[b].rt_priority == 0 < st[a].rt_priority, (a, b, st)
        elif a in due and b in due and (cb < ca or (ca == cb and due[b] < due[a])):
            assert st[b].rt_priority > st[a].rt_priority >= 1, (a, b, st)


def check_demand_bound(clusters, jobs, decision):
    """An independent necessary condition on an admitted point (not the gate's analysis):
    within one cluster, for every union U of the deadline jobs' core sets and every deadline
    d, the jobs confined to U that are due by d need at most |U| x d core-seconds of their
    remaining work at the cluster's frequency. No scheduler can beat it."""
    kof = {c: k for k in clusters for c in k.cpus}
    due = []
    for j in jobs:
        cpus = frozenset(decision.jobs[j.pid].cpus) if j.pid in decision.jobs else frozenset()
        assert cpus, f"pid {j.pid}: a deadline job without cores was admitted"
        k = kof[next(iter(cpus))]
        f = decision.freq_khz[k.name]
        due.append(
            (cpus, k.name, j.remaining_s, work_at(j.profile, f, k.capacity, j.remaining_work))
        )
    for k in clusters:
        mine = [x for x in due if x[1] == k.name]
        for r in range(1, len(mine) + 1):
            for combo in itertools.combinations(mine, r):
                u = frozenset().union(*(x[0] for x in combo))
                for d in {x[2] for x in mine}:
                    need = sum(c for cpus, _, dl, c in mine if cpus <= u and dl <= d)
                    assert need <= len(u) * d * (1 + 1e-9) + 1e-12, (
                        f"{k.name}: {need:.4g} core-s due by {d:.4g} s on {len(u)} cores"
                    )


def check_invariants(clusters, jobs, proposal, r, others=()):
    check_priorities(jobs, r.decision)
    if r.feasible:
        check_demand_bound(clusters, jobs, r.decision)
    tables = {k.name: k.freqs_khz for k in clusters}
    for name, f in r.decision.freq_khz.items():
        assert f in tables[name], (name, f)
    where = {c: k.name for k in clusters for c in k.cpus}
    dedicated = [set(al.cpus) for al in r.alloc.values() if al.kind == "heavy"]
    for al in r.alloc.values():
        if al.kind in ("heavy", "light"):
            assert len({where[c] for c in al.cpus}) == 1, al
    if r.feasible:  # the safest fallback may have to share cores when there are too few
        for a_, b_ in itertools.combinations(dedicated, 2):
            assert a_.isdisjoint(b_)
    # the flag tells the truth about the returned point
    a = Assignment(
        clusters,
        jobs,
        r.decision.freq_khz,
        {p: s.cpus for p, s in r.decision.jobs.items()},
        tuple(r.decision.jobs[p].cpus for p in others),
    )
    assert r.feasible == feasible(a)
    for p in others:  # a best-effort job keeps at least one core
        assert r.decision.jobs[p].cpus
    if r.feasible:
        for k in clusters:  # repairs only ever raise frequencies
            assert r.decision.freq_khz[k.name] >= min(
                f for f in k.freqs_khz if f >= min(proposal.freq_khz[k.name], k.freqs_khz[-1])
            )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_gate_finds_a_feasible_point_whenever_one_exists(inst):
    clusters, jobs, proposal = inst
    r = FederatedGate(clusters).repair(proposal, jobs)
    check_invariants(clusters, jobs, proposal, r)
    if not r.feasible:
        assert not brute_force_exists(clusters, jobs), "brute force found a point the gate missed"
    was_feasible = feasible(
        Assignment(clusters, jobs, proposal.freq_khz, {p: s.cpus for p, s in proposal.jobs.items()})
    )
    if was_feasible:  # kept as proposed; at most the priorities the analysis assumes set
        assert r.decision.freq_khz == proposal.freq_khz
        assert {p: s.cpus for p, s in r.decision.jobs.items()} == {
            p: s.cpus for p, s in proposal.jobs.items()
        }
        assert all("rt priority" in e for e in r.events)
        assert (r.decision is proposal) == (not r.events)


@st.composite
def best_effort_instances(draw):
    """1-2 clusters, 1-2 deadline jobs and 1-2 best-effort jobs, biased to the hard case: a
    deadline job on a whole cluster at its lowest OPP, heavy there on every core."""
    clusters, cpu = [], 0
    for i in range(draw(st.sampled_from((1, 1, 2)))):
        m = draw(st.integers(2 if i == 0 else 1, 3))
        table = tuple(
            sorted(draw(st.sets(st.sampled_from(TABLE_CHOICES), min_size=2 - i, max_size=3)))
        )
        cap = draw(st.sampled_from((0.5, 1.0, 1.5)))
        clusters.append(cl(f"c{i}", range(cpu, cpu + m), table, cap))
        cpu += m
    online = list(range(cpu))
    lowest = draw(st.booleans())
    freq = {
        k.name: k.freqs_khz[0] if lowest else draw(st.sampled_from(k.freqs_khz)) for k in clusters
    }
    jobs, settings_ = [], {}
    for j in range(draw(st.sampled_from((1, 1, 2)))):
        work = draw(st.floats(0.2, 6.0))
        span = work * draw(st.floats(0.05, 1.0))
        beta = draw(st.sampled_from((0.0, 0.2, 0.5)))
        job = GateJob(100 + j, prof(work, span, beta), 1.0, draw(st.sampled_from((1.0, 0.5))))
        k = draw(st.sampled_from(clusters))
        if j == 0 or draw(st.booleans()):  # a whole cluster, deadline under C at its lowest OPP
            settings_[job.pid] = JobSetting(k.cpus)
            d = requirement(job, k, k.freqs_khz[0])[2] * draw(st.floats(0.5, 1.05))
        else:
            settings_[job.pid] = JobSetting(tuple(sorted(draw(st.sets(st.sampled_from(online))))))
            d = draw(st.floats(0.1, 6.0))
        jobs.append(GateJob(job.pid, job.profile, d, job.remaining_work))
    others = tuple(range(900, 900 + draw(st.integers(1, 2))))
    for p in others:
        cpus = draw(st.one_of(st.just(set(online)), st.sets(st.sampled_from(online), min_size=1)))
        settings_[p] = JobSetting(tuple(sorted(cpus)))
    return tuple(clusters), tuple(jobs), Decision(freq, settings_), others


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(best_effort_instances())
def test_gate_with_best_effort_jobs_finds_a_feasible_point_whenever_one_exists(inst):
    # best-effort jobs may not touch heavy cores: the gate must still find room for them
    # (at a higher OPP, with fewer heavy cores) whenever any point leaves one core free
    clusters, jobs, proposal, others = inst
    r = FederatedGate(clusters).repair(proposal, jobs)
    check_invariants(clusters, jobs, proposal, r, others)
    assert r.feasible == brute_force_exists(clusters, jobs, room=True), "the gate missed a point"


def test_heavy_cores_shared_with_a_best_effort_job_get_the_cheapest_room():
    # at 0.5 GHz the job is heavy on both cores, leaving the best-effort job none; at 1 GHz
    # it is light on one core (cheaper than 2 GHz), and the best-effort job keeps a core
    k = cl("c0", (0, 1), (GHZ // 2, GHZ, 2 * GHZ))
    job = GateJob(100, prof(0.478, 0.114, 0.163), 0.766)
    d = Decision({"c0": GHZ // 2}, {100: JobSetting((0, 1)), 999: JobSetting((0, 1))})
    gate = FederatedGate([k])
    r = gate.repair(d, [job])
    assert r.feasible and r.decision.freq_khz == {"c0": GHZ}
    assert r.alloc[100].kind == "light" and len(r.decision.jobs[100].cpus) == 1
    assert r.decision.jobs[999].cpus and not gate.check(r.decision, [job])[0]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_cpus=3))
def test_gate_agrees_with_brute_force_at_the_top_opps(inst):
    # larger clusters; the brute force only looks at the top OPPs, which the test below
    # shows is enough (feasibility is monotone in f)
    clusters, jobs, proposal = inst
    r = FederatedGate(clusters).repair(proposal, jobs)
    check_invariants(clusters, jobs, proposal, r)
    assert r.feasible == brute_force_exists(clusters, jobs, all_freqs=False)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(instances(max_cpus=3), st.data())
def test_feasibility_is_monotone_in_frequency(inst, data):
    # the lemma behind the raise-only repair: a feasible point stays feasible at higher f
    clusters, jobs, proposal = inst
    r = FederatedGate(clusters).repair(proposal, jobs)
    assume(r.feasible)
    cpus = {p: s.cpus for p, s in r.decision.jobs.items()}
    picks = data.draw(
        st.lists(st.integers(0, 2), min_size=2 * len(clusters), max_size=2 * len(clusters))
    )
    low = {k.name: k.freqs_khz[picks[i] % len(k.freqs_khz)] for i, k in enumerate(clusters)}
    if not feasible(Assignment(clusters, jobs, low, cpus)):
        low = dict(r.decision.freq_khz)
    high = {}
    for i, k in enumerate(clusters):
        start = k.freqs_khz.index(low[k.name])
        high[k.name] = k.freqs_khz[min(start + picks[len(clusters) + i], len(k.freqs_khz) - 1)]
    assert feasible(Assignment(clusters, jobs, high, cpus))


@settings(max_examples=50, deadline=None)
@given(instances())
def test_repaired_decision_is_a_fixed_point(inst):
    clusters, jobs, proposal = inst
    gate = FederatedGate(clusters)
    r = gate.repair(proposal, jobs)
    again = gate.repair(r.decision, jobs)
    if r.feasible:
        assert again.decision is r.decision and again.feasible


def test_light_jobs_on_overlapping_core_sets_are_not_admitted():
    """Three chains (C 0.9 s, D 1 s) on a two-core cluster, on cores (0,), (0, 1) and (1,):
    2.7 core-seconds due in 1 s on 2 cores. The gate's tests of pools alone passed it when
    the check of overlapping but different core sets was off; the demand bound catches it."""
    k = cl("c", (0, 1), (GHZ,))
    jobs = tuple(GateJob(100 + i, prof(0.9, 0.9, name=f"j{i}"), 1.0) for i in range(3))
    sets = {100: (0,), 101: (0, 1), 102: (1,)}
    proposal = Decision({"c": GHZ}, {p: JobSetting(c) for p, c in sets.items()})
    reasons, _ = analyse(Assignment((k,), jobs, proposal.freq_khz, sets))
    assert any("overlapping but different core sets" in r for r in reasons)
    with pytest.raises(AssertionError, match="core-s due by 1 s on 2 cores"):
        check_demand_bound((k,), jobs, proposal)
    r = FederatedGate((k,)).repair(proposal, jobs)
    assert not r.feasible
    check_invariants((k,), jobs, proposal, r)


def test_violations_name_the_cause():
    k = cl("big", (0, 1), (GHZ,))
    jobs = (GateJob(1, prof(4.0, 0.5), 1.5), GateJob(2, prof(1.0, 1.0), 3.0))
    reasons, alloc = analyse(Assignment((k,), jobs, {"big": GHZ}, {1: (0, 1), 2: (1,)}))
    assert any("needs 4 cores" in r for r in reasons)
    assert any("shared with pid 2" in r for r in reasons)
    assert alloc[1].kind == "heavy" and alloc[2].kind == "light"
    reasons, _ = analyse(Assignment((k,), jobs[:1], {"big": 1_234}, {1: (0, 7)}))
    assert any("not an allowed OPP" in r for r in reasons) and any(
        "core 7 is not online" in r for r in reasons
    )


# ------------------------------------------------------------------------ optimised internals


@settings(max_examples=150, deadline=None)
@given(instances(max_cpus=3), st.floats(-1.0, 6.0))
def test_requirement_table_equals_the_pointwise_requirement(inst, d):
    """The one-loop table is the same tuples, bit for bit, as requirement() per OPP."""
    clusters, jobs, _ = inst
    for j in jobs + (GateJob(7, jobs[0].profile, d, 0.3),):
        for k in clusters:
            assert requirements(j, k) == [requirement(j, k, f) for f in k.freqs_khz]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_cpus=3))
def test_repair_shortcuts_change_nothing(inst):
    """A job that fits no cluster alone leaves no feasible map; the memoised costs and the
    tables from the proposal's OPP up are the cost model and requirement() themselves."""
    clusters, jobs, proposal = inst
    gate = FederatedGate(clusters)
    order = gate._order(jobs)
    an = _analyse(gate._assignment(proposal, order), gate._kwhere)
    assume(an.reasons)
    rep = _Repair(gate, proposal, order, an)
    all_k = [list(range(len(clusters))) for _ in order]
    alone = [[rep.best(ki, 1 << ji) for ki in range(len(clusters))] for ji in range(len(order))]
    assert rep.homeless() == any(all(p is None for p in row) for row in alone)
    if rep.homeless():
        assert rep.search(all_k) is None
    for ji, j in enumerate(order):
        for ki, k in enumerate(clusters):
            table = rep.req(ji, ki)
            assert all(r is None for r in table[: rep.base[ki]])
            for fi in range(rep.base[ki], len(k.freqs_khz)):
                assert table[fi] == requirement(j, k, k.freqs_khz[fi])
                for n in (1, len(k.cpus)):
                    assert gate._cost(ki, k.freqs_khz[fi], n) == default_cost(k, k.freqs_khz[fi], n)


def test_cost_memo_follows_a_replaced_cost_model():
    k = cl("a", (0, 1), (GHZ, 2 * GHZ))
    gate = FederatedGate([k])
    assert gate._cost(0, GHZ, 2) == default_cost(k, GHZ, 2)
    gate.cost = lambda cluster, khz, n: 42.0
    assert gate._cost(0, GHZ, 2) == 42.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.frozensets(st.integers(0, 3), min_size=1),  # cores
            st.integers(0, 99),  # the priority agent's rt
            st.one_of(st.none(), st.floats(0.1, 5.0)),  # deadline (None: best effort)
        ),
        min_size=1,
        max_size=8,
    )
)
def test_order_priorities_holds_for_any_proposed_priorities(specs):
    """Whatever priorities the agent proposes (up to 99), the order the analysis assumes
    holds afterwards: no two jobs that must differ end up equal at the 1..99 ceiling."""
    settings_ = {100 + i: JobSetting(tuple(sorted(c)), rt) for i, (c, rt, _) in enumerate(specs)}
    jobs = sorted(
        (GateJob(100 + i, prof(1.0, 0.1), d) for i, (_, _, d) in enumerate(specs) if d is not None),
        key=lambda j: (j.remaining_s, j.pid),
    )
    out, _ = order_priorities(Decision({}, settings_), jobs)
    check_priorities(jobs, out)
    assert all(0 <= s.rt_priority <= 99 for s in out.jobs.values())


def test_lifting_priorities_past_99_keeps_them_apart():
    """Two jobs on core 0 at 99 and 98 (deadline order), one at 1 on core 1, and a job over
    both cores that must run below all three (0): lifting by one used to cap both at 99."""
    st_ = {
        1: JobSetting((0,), 99),
        2: JobSetting((0,), 98),
        3: JobSetting((1,), 1),
        4: JobSetting((0, 1), 50),
    }
    jobs = [GateJob(p, prof(1.0, 0.1), float(p)) for p in (1, 2, 3, 4)]
    out, _ = order_priorities(Decision({}, st_), jobs)
    check_priorities(jobs, out)
    rt = {p: s.rt_priority for p, s in out.jobs.items()}
    assert rt[1] > rt[2] > rt[4] >= 1 and rt[3] > rt[4]


def test_light_jobs_the_gate_admits_meet_their_deadlines_in_the_plant():
    """Closed loop: a parallel job (C 4 s, L 0.01 s, D 4.05 s) and a chain (C = L = 3.5 s,
    D 4.1 s), both light, proposed on one core. A shared pool of two cores, which the gate
    once admitted, holds the chain behind the parallel job until 2 s: it ended at 4.15 s."""
    from agents.policy import Policy
    from agents.stages import GateStage
    from daemon.simrun import run_sim
    from platforms.dag import DagBuilder
    from platforms.sim.plant import SimJob

    spec = load_board("orin-nx")
    f = spec.clusters[0].fmax_khz
    parallel, chain = DagBuilder("A"), DagBuilder("B")
    for _ in range(400):
        parallel.add(0.01 * f * 1e3)
    prev: tuple = ()
    for _ in range(350):
        prev = (chain.add(0.01 * f * 1e3, 0.0, prev),)

    def item(dag, name, deadline):
        c, span = dag.work_span(f * 1e3, 1.0)
        return SimJob(dag, name, deadline), JobProfile(name, c, span, 0.0, c, f, 4)

    class OneCore(Policy):
        name, period_s = "onecore", 0.05

        def decide(self, obs):
            return Decision(
                {c.name: c.freqs_khz[-1] for c in obs.clusters},
                {j.pid: JobSetting((0,)) for j in obs.jobs},
            )

    stage = GateStage()
    items = [item(parallel.build(), "A", 4.05), item(chain.build(), "B", 4.10)]
    res = run_sim("orin-nx", OneCore(), items, stages=[stage], seed=0)
    assert stage.last is not None and stage.last.feasible
    assert [j.deadline_met for j in res.jobs] == [True, True], [j.makespan_s for j in res.jobs]


def test_beyond_max_maps_the_gate_still_finds_a_feasible_map(monkeypatch):
    """8 deadline jobs on three clusters are 6561 maps, past MAX_MAPS: the greedy placement
    dead-ends on about a quarter of the instances that have a feasible map, and the
    bounded search after it must find one."""
    import random

    import agents.gate_repair as gate_repair_mod

    spec = load_board("rubikpi3")
    ks = [GateCluster(c.name, c.cpus, c.freqs_khz, c.capacity) for c in spec.clusters]
    every = tuple(c for k in ks for c in k.cpus)
    rng = random.Random(1)
    feasible_exists = 0
    for _ in range(150):
        jobs = []
        for i in range(8):
            w, d = rng.uniform(0.05, 3), rng.uniform(0.3, 2.5)
            span = w * rng.choice([1.0, 0.5, 0.1, 0.02])
            jobs.append(GateJob(i + 1, JobProfile("j", w, span, 0.0, w, 2400000, 3), d))
        dec = Decision(
            {k.name: k.freqs_khz[0] for k in ks}, {j.pid: JobSetting(every) for j in jobs}
        )
        bounded = FederatedGate(ks).repair(dec, jobs)
        with monkeypatch.context() as m:
            m.setattr(gate_repair_mod, "MAX_MAPS", 10**9)
            exact = FederatedGate(ks).repair(dec, jobs)
        feasible_exists += exact.feasible
        assert bounded.feasible or not exact.feasible
        if bounded.feasible:
            assert FederatedGate(ks).check(bounded.decision, jobs)[0] == []
    assert feasible_exists >= 20


def test_a_lone_light_job_whose_work_equals_its_deadline_fits_one_core():
    """C(f) = D exactly: requirement() calls it light, so one core must hold it; the pool
    test's L + (W - L) / 1 rounded above W and the repair found no point (hypothesis)."""
    c0 = GateCluster("c0", (0, 1), (400000, 800000), 0.5)
    c1 = GateCluster("c1", (2,), (400000,), 0.5)
    p = JobProfile("j", 0.5046728114416541, 0.025233640572082706, 0.0, 0.5046728114416541, GHZ, 1)
    job = GateJob(100, p, 1.2616820286041353, 0.5)
    assert requirement(job, c0, 400000)[0] == LIGHT
    assert pool_fits([(job.remaining_s, requirement(job, c0, 400000)[2], p.span_s)], 1)
    d = Decision(
        {"c0": 400000, "c1": 400000},
        {100: JobSetting((0, 1)), 900: JobSetting((0, 1, 2))},
    )
    r = FederatedGate([c0, c1]).repair(d, [job])
    assert r.feasible
