"""The daemon's stages plan around the mixed-criticality reservation (agents.mixed).

Which cluster a HI job reserves (plan_reservation), and the policy's stages run on the board
as the reservation leaves it (AroundReservation): LO work on the unreserved clusters, each HI
job alone on its cluster.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.mixed import (
    HI_RT_PRIORITY,
    NEED_MARGIN,
    SHARED_HI_RT_PRIORITY,
    STAY_MARGIN,
    AroundReservation,
    ClusterReservation,
    daemon_stages,
    fits,
    fits_together,
    needed_khz,
    plan_reservation,
)
from agents.policy import Decision, JobSetting
from agents.schedulability import jobs_from_obs
from agents.stages import GateStage
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation


def _cluster(name, first, n, cap, table):
    cpus = tuple(range(first, first + n))
    return ClusterObs(
        name, first, cpus, cpus, table, cap, table[0], table[0], table[-1], "userspace"
    )


BIG = _cluster("big", 0, 4, 1.0, (1000, 1500, 2000))
LITTLE = _cluster("little", 4, 2, 0.5, (500, 1000))


def _prof(work, span):
    return JobProfile(
        "x", work_s=work, span_s=span, beta=0.0, ref_makespan_s=1.0, ref_khz=2000, ref_cores=4
    )


def _job(pid, crit, work, span, deadline, cpus=()):
    return JobObs(pid, f"j{pid}", crit, 0.0, 0.0, deadline, cpus, profile=_prof(work, span))


def _obs(clusters, jobs):
    return Observation(0.0, "toy", tuple(clusters), (), (), tuple(jobs))


# --------------------------------------------------------------------------------------------
# Which cluster


def test_a_hi_job_reserves_the_least_capable_cluster_it_fits():
    mid = _cluster("mid", 4, 2, 1.0, (1000, 2000))
    lo = _cluster("lo", 6, 2, 0.5, (500, 1000))
    small = _job(10, "hi", 0.5, 0.05, 1.0)  # 0.05 + 0.45 / 2 = 0.275 s on mid at 2000
    plan = plan_reservation(_obs((BIG, mid, lo), (small,)))
    assert set(plan.hi) == {"mid"}
    assert plan.lo_cpus == (0, 1, 2, 3, 6, 7)  # the big cluster stays for LO work
    big = _job(11, "hi", 4.0, 0.1, 1.5)  # fits the big cluster only
    assert set(plan_reservation(_obs((BIG, mid, lo), (big,))).hi) == {"big"}


def test_a_hi_job_that_fits_nowhere_takes_the_fastest_cluster():
    mid = _cluster("mid", 4, 2, 1.0, (1000, 2000))
    job = _job(10, "hi", 40.0, 0.1, 1.0)
    assert not fits(job, BIG) and not fits(job, mid)
    assert set(plan_reservation(_obs((mid, BIG, LITTLE), (job,))).hi) == {"big"}


def test_a_hi_job_moves_down_as_its_work_shrinks_and_not_back_and_forth():
    """A job holding a cluster takes a less capable one as soon as it fits there with
    HI_MARGIN; it keeps the one it holds while it fits with STAY_MARGIN, though a job new
    to it would need HI_MARGIN; past STAY_MARGIN it leaves for one it fits."""
    mid = _cluster("mid", 4, 2, 1.0, (1000, 2000))
    board = (BIG, mid, LITTLE)
    small = _job(10, "hi", 0.5, 0.05, 1.0, cpus=BIG.online)
    assert set(plan_reservation(_obs(board, (small,))).hi) == {"mid"}
    # 0.05 + 0.95 / 2 = 0.525 s on mid: 85 % of 0.62 s, 95 % of 0.55 s; 0.29 s on big
    band = _job(10, "hi", 1.0, 0.05, 0.62)
    assert not fits(band, mid) and fits(band, mid, STAY_MARGIN) and fits(band, BIG)
    assert set(plan_reservation(_obs(board, (band,))).hi) == {"big"}
    on_mid = replace(band, cpus=mid.online)
    assert set(plan_reservation(_obs(board, (on_mid,))).hi) == {"mid"}
    late = replace(on_mid, deadline_s=0.55)
    assert set(plan_reservation(_obs(board, (late,))).hi) == {"big"}


def test_fits_keeps_a_margin():
    job = _job(10, "hi", 4.0, 0.1, 1.2)  # 1.075 s on the big cluster at 2000: 90 % of 1.2 s
    assert fits(job, BIG, margin=1.0) and not fits(job, BIG)


def test_the_reserved_frequency_leaves_the_hi_job_a_margin():
    """The floor is the lowest OPP whose Graham bound is within NEED_MARGIN of the time
    left: with 2.3 s left the bound at 1000 kHz, 2.15 s, fits 1.0 of it but not 0.9."""
    obs = _obs((BIG, LITTLE), (_job(10, "hi", 4.0, 0.1, 2.3),))
    assert NEED_MARGIN == 0.9
    assert needed_khz(obs.jobs[0], BIG, margin=1.0) == 1000
    assert needed_khz(obs.jobs[0], BIG, NEED_MARGIN) == 1500
    out = ClusterReservation()(Decision({"big": 1000, "little": 500}, {}), obs)
    assert out.freq_khz["big"] == 1500


def test_the_floor_counts_the_whole_span_at_a_dag_s_tail():
    """90 % done, 0.4 s of work left at 2000 kHz, all of it on the critical path (span 0.5 s):
    the tail runs serially. Shrinking the span with the work done gave a 0.14 s bound at
    2000 kHz and a 1000 kHz floor, where that tail takes 0.8 s against 0.36 s left; the
    bound is 0.4 s at 2000 kHz now."""
    job = replace(_job(10, "hi", 4.0, 0.5, 1.0), elapsed_s=0.64, progress=0.9)
    assert needed_khz(job, BIG, margin=1.0) == 2000  # 0.4 s <= 0.36 s? no: the top, and late
    job = replace(job, elapsed_s=0.5)  # 0.5 s left: 0.4 s at 2000, 0.53 s at 1500
    assert needed_khz(job, BIG, margin=1.0) == 2000
    assert needed_khz(replace(job, elapsed_s=0.4), BIG, margin=1.0) == 1500  # 0.6 s left


def test_the_reserved_cluster_leaves_a_kernel_governor():
    """A kernel governor ignores the frequency written for its cluster: the reserved one
    leaves it, so the floor holds; the other cluster keeps its governor."""
    obs = _obs((BIG, LITTLE), (_job(10, "hi", 4.0, 0.1, 1.5),))
    d = Decision({"big": 1000, "little": 500}, {}, {"big": "schedutil", "little": "schedutil"})
    out = ClusterReservation()(d, obs)
    assert out.governor == {"little": "schedutil"}
    assert out.freq_khz["big"] >= needed_khz(obs.jobs[0], BIG)


def test_one_cluster_stays_for_lo_work_and_a_one_cluster_board_shares():
    his = [_job(10 + i, "hi", 0.5, 0.05, 1.0 + i) for i in range(3)]
    plan = plan_reservation(_obs((BIG, LITTLE), his))
    assert len(plan.hi) == 1 and not plan.shared and plan.lo_cpus
    plan = plan_reservation(_obs((BIG,), his))
    assert set(plan.hi) == {"big"} and plan.shared and plan.lo_cpus == BIG.online


def test_a_hi_job_without_a_cluster_of_its_own_shares_lo_work_s_above_it():
    """Two HI jobs on a two-cluster board: the second (later deadline) used to run as LO
    work, at whatever priority the policy gave it. It now shares the LO cluster: on the
    cores its policy gave it there, SCHED_FIFO above every LO job on them (their priorities
    capped below), and the cluster at least at its need."""
    first = _job(10, "hi", 4.0, 0.1, 1.5)  # only the big cluster holds it
    second = _job(11, "hi", 0.5, 0.05, 2.0, cpus=(0, 4))
    lo = _job(12, "lo", 0.1, 0.01, 1.0, cpus=(4,))
    be = JobObs(13, "be", "lo", 0.0, 0.0, None, (4, 5))
    obs = _obs((BIG, LITTLE), (first, second, lo, be))
    plan = plan_reservation(obs)
    assert {n: j.pid for n, j in plan.hi.items()} == {"big": 10}
    assert {n: [j.pid for j in js] for n, js in plan.shares.items()} == {"little": [11]}
    assert plan.sharer_priorities() == {11: SHARED_HI_RT_PRIORITY}
    d = Decision(
        {"big": 2000, "little": 500},
        {
            10: JobSetting((0, 1, 2, 3), 90),
            11: JobSetting((0, 4), 10),
            12: JobSetting((4,), 99, 2),
            13: JobSetting((4, 5), 0, 5),
        },
        {"little": "schedutil"},
    )
    out = ClusterReservation()(d, obs)
    assert out.jobs[10] == JobSetting(BIG.online, HI_RT_PRIORITY)
    assert out.jobs[11] == JobSetting((4,), SHARED_HI_RT_PRIORITY)  # its core there
    assert out.jobs[12] == JobSetting((4,), SHARED_HI_RT_PRIORITY - 1, 2)  # capped below
    assert out.jobs[13] == JobSetting((4, 5), 0, 5)
    assert out.freq_khz["little"] >= needed_khz(second, LITTLE, NEED_MARGIN) > 500
    assert "little" not in out.governor  # schedutil would ignore the floor
    # given no core there, it takes all of the cluster's; LO priorities there stay below
    d.jobs[11] = JobSetting((0,), 10)
    d.jobs[13] = JobSetting((5,), 98)
    out = ClusterReservation()(d, obs)
    assert out.jobs[11] == JobSetting(LITTLE.online, SHARED_HI_RT_PRIORITY)
    assert out.jobs[13] == JobSetting((5,), SHARED_HI_RT_PRIORITY - 1)
    # a later third HI job shares the same cluster one priority below the second
    third = _job(14, "hi", 0.2, 0.02, 3.0)
    plan = plan_reservation(_obs((BIG, LITTLE), (first, second, third)))
    assert [j.pid for j in plan.shares["little"]] == [11, 14]
    assert plan.sharer_priorities() == {11: SHARED_HI_RT_PRIORITY, 14: SHARED_HI_RT_PRIORITY - 1}


def test_a_hi_job_that_fits_no_free_cluster_alone_takes_them_together():
    """Three clusters: the first HI job holds the big one; the second fits neither of the
    two left alone but fits both together (a greedy run on cores of unequal speed), so it
    takes both and LO work shares the slowest below it. Before, it took the faster of the
    two where it could not meet its deadline and the other stayed for LO work."""
    mid = _cluster("mid", 4, 2, 1.0, (1000, 2000))
    lo = _cluster("lo", 6, 2, 0.5, (500, 1000))
    first = _job(10, "hi", 2.0, 0.05, 0.9)  # fits the big cluster only (0.54 s of 0.72)
    # 1.6 s of work, span 0.02: 0.81 s on mid, 3.24 s on lo, 0.71 s on both (rates 1, 1,
    # 0.25, 0.25: 1.58 / 2.5 + 0.02 x 4); 0.95 s left, of which HI_MARGIN keeps 0.76 s
    second = _job(11, "hi", 1.6, 0.02, 0.95)
    lo_job = _job(12, "lo", 0.1, 0.01, 1.0, cpus=(6,))
    obs = _obs((BIG, mid, lo), (first, second, lo_job))
    assert not fits(second, mid) and not fits(second, lo) and fits_together(second, [mid, lo])
    plan = plan_reservation(obs)
    assert {n: j.pid for n, j in plan.hi.items()} == {"big": 10, "mid": 11, "lo": 11}
    assert plan.shared and plan.lo_cpus == lo.online and not plan.shares
    d = Decision(
        {"big": 1000, "mid": 1000, "lo": 500},
        {10: JobSetting((0,), 90), 11: JobSetting((4,), 10), 12: JobSetting((6,), 60)},
    )
    out = ClusterReservation()(d, obs)
    assert out.jobs[10] == JobSetting(BIG.online, HI_RT_PRIORITY)
    assert out.jobs[11] == JobSetting(mid.online + lo.online, HI_RT_PRIORITY)
    assert out.jobs[12] == JobSetting((6,), 0)  # below it, its core on the slowest cluster
    assert out.freq_khz["mid"] == 2000 and out.freq_khz["lo"] == 1000
    # where neither alone nor together would do, it takes the faster and LO keeps the other
    hopeless = replace(second, profile=replace(second.profile, work_s=3.0))  # 1.27 s together
    plan = plan_reservation(_obs((BIG, mid, lo), (first, hopeless, lo_job)))
    assert {n: j.pid for n, j in plan.hi.items()} == {"big": 10, "mid": 11}
    assert not plan.shared and plan.lo_cpus == lo.online


def test_on_a_one_cluster_board_a_second_hi_job_runs_below_the_first_above_lo():
    first = _job(10, "hi", 1.0, 0.1, 1.5)
    second = _job(11, "hi", 0.5, 0.05, 2.0)
    lo = _job(12, "lo", 0.1, 0.01, 1.0)
    obs = _obs((BIG,), (first, second, lo))
    plan = plan_reservation(obs)
    assert plan.shared and [j.pid for j in plan.shares["big"]] == [11]
    d = Decision({"big": 1000}, {p: JobSetting(BIG.online, 90) for p in (10, 11, 12)})
    out = ClusterReservation()(d, obs)
    assert out.jobs[10].rt_priority == HI_RT_PRIORITY
    assert out.jobs[11] == JobSetting(BIG.online, HI_RT_PRIORITY - 1)
    assert out.jobs[12].rt_priority == 0
    assert out.freq_khz["big"] >= max(
        needed_khz(first, BIG, NEED_MARGIN), needed_khz(second, BIG, NEED_MARGIN)
    )


# --------------------------------------------------------------------------------------------
# The stages around the reservation


def _mixed_obs():
    """A HI job that only the big cluster can hold, and a LO deadline job that fits one big
    core, or both little cores at their top but not lower."""
    hi = _job(10, "hi", 4.0, 0.1, 1.5)
    lo = _job(11, "lo", 0.3, 0.02, 1.0)
    return _obs((BIG, LITTLE), (hi, lo))


def _proposal():
    # the agents put the LO job on a big core and left the little cluster at its lowest OPP
    return Decision(
        {"big": 2000, "little": 500},
        {10: JobSetting((1, 2, 3), 20), 11: JobSetting((0,), 10)},
    )


def test_the_gate_certifies_lo_work_on_the_cores_the_reservation_leaves_it():
    obs = _mixed_obs()
    little_top = LITTLE.freqs_khz[-1]
    # Planned on the whole board, the gate accepts the LO job on its big core; the
    # reservation then moves it to the little cluster at 500 kHz, where its bound is
    # 0.16 + 2.24 / 2 = 1.28 s against a 1.0 s deadline.
    plain = [GateStage(), ClusterReservation()]
    d = _proposal()
    for stage in plain:
        d = stage(d, obs)
    assert d.jobs[11].cpus == LITTLE.online and d.freq_khz["little"] < little_top
    # Around the reservation the gate sees the LO job on the little cluster and raises it.
    d = _proposal()
    stages = daemon_stages([GateStage()])
    for stage in stages:
        d = stage(d, obs)
    assert d.jobs[11].cpus == LITTLE.online and d.freq_khz["little"] == little_top
    assert stages[0].last.feasible  # the LO part's repair is feasible: nothing left to luck
    assert d.jobs[10] == JobSetting(BIG.online, HI_RT_PRIORITY)
    assert d.freq_khz["big"] >= needed_khz(obs.jobs[0], BIG)


class _Recorder:
    """A stage that records what it was shown and can raise one cluster."""

    def __init__(self, raise_to=None):
        self.calls = []
        self.raise_to = raise_to or {}

    def __call__(self, decision, obs):
        self.calls.append((decision.copy(), obs))
        out = decision.copy()
        for name, khz in self.raise_to.items():
            if any(c.name == name for c in obs.clusters):
                out.freq_khz[name] = khz
        return out

    def job_done(self, pid, t):
        return pid

    def calibration(self):
        return {"alpha": 0.1}


def test_each_hi_job_is_planned_alone_on_its_cluster_at_the_reserved_frequency():
    obs = _mixed_obs()
    rec = _Recorder()
    AroundReservation(rec)(_proposal(), obs)
    (lo_d, lo_obs), (hi_d, hi_obs) = rec.calls
    assert [c.name for c in lo_obs.clusters] == ["little"]
    assert [j.pid for j in lo_obs.jobs] == [11] and set(lo_d.jobs) == {11}
    assert lo_d.jobs[11] == JobSetting(LITTLE.online, 10)  # its priority kept
    assert [c.name for c in hi_obs.clusters] == ["big"] and [j.pid for j in hi_obs.jobs] == [10]
    assert hi_d.jobs == {10: JobSetting(BIG.online, HI_RT_PRIORITY)}
    assert hi_d.freq_khz == {"big": max(2000, needed_khz(obs.jobs[0], BIG))}


def test_a_hi_job_sharing_a_cluster_is_planned_before_the_lo_work_there():
    """The second HI job is planned alone on the LO cluster first; LO work then gets the
    cores it left. Planned together, the gate's safest point gave the LO job with the
    earlier deadline both little cores and the HI job none of its own."""
    first = _job(10, "hi", 2.0, 0.1, 0.9)  # only the big cluster holds it
    second = _job(11, "hi", 0.2, 0.01, 1.0)  # one little core at the top holds it
    lo = _job(12, "lo", 0.2, 0.01, 0.95)  # so does the LO job, but not both on one
    obs = _obs((BIG, LITTLE), (first, second, lo))
    proposal = Decision(
        {"big": 2000, "little": 500},
        {10: JobSetting(BIG.online), 11: JobSetting((0, 4), 10), 12: JobSetting((4, 5), 20)},
    )
    rec = _Recorder()
    stage = AroundReservation(rec)
    stage(proposal, obs)
    (share_d, share_obs), (lo_d, lo_obs), (hi_d, hi_obs) = rec.calls
    assert [j.pid for j in share_obs.jobs] == [11] and share_d.jobs == {11: JobSetting((4,), 10)}
    assert share_d.freq_khz["little"] >= needed_khz(second, LITTLE, NEED_MARGIN)
    # LO work is planned on the little core the HI job left
    assert [j.pid for j in lo_obs.jobs] == [12] and lo_obs.cluster("little").online == (5,)
    assert lo_d.jobs == {12: JobSetting((5,), 20)}
    # a HI job that takes every core of the cluster leaves LO work all of it, below it
    rec = _Recorder()
    AroundReservation(rec)(replace(proposal, jobs=proposal.jobs | {11: JobSetting((4, 5))}), obs)
    (_, lo_obs) = rec.calls[1]
    assert lo_obs.cluster("little").online == (4, 5)
    # and the reservation keeps both parts
    d = ClusterReservation(planner=stage.planner)(stage(proposal, obs), obs)
    assert d.jobs[11] == JobSetting((4,), SHARED_HI_RT_PRIORITY)
    assert d.jobs[12] == JobSetting((5,), 20)


def test_a_stage_raising_the_hi_cluster_is_kept_by_the_reservation():
    """The shield raises a HI job's cluster above the Graham bound's need when its predictor
    says the tail is longer: the reservation must not lower it back."""
    obs = _mixed_obs()
    obs = replace(obs, jobs=(replace(obs.jobs[0], deadline_s=3.0), obs.jobs[1]))
    assert needed_khz(obs.jobs[0], BIG) < 2000
    prop = _proposal()
    prop.freq_khz["big"] = 1000
    d = prop
    for stage in daemon_stages([_Recorder({"big": 2000})]):
        d = stage(d, obs)
    assert d.freq_khz["big"] == 2000


def test_the_wrapped_stage_s_hooks_are_reachable():
    rec = _Recorder()
    wrapped = AroundReservation(rec)
    assert wrapped.job_done(7, 1.0) == 7 and wrapped.calibration() == {"alpha": 0.1}
    assert wrapped.stage is rec


def test_without_hi_jobs_or_reservation_the_stage_runs_as_given():
    obs = _obs((BIG, LITTLE), (_job(11, "lo", 0.3, 0.02, 1.0),))
    rec = _Recorder()
    AroundReservation(rec)(_proposal(), obs)
    assert rec.calls[0][1] is obs
    stages = daemon_stages([rec], reserve=False)
    assert stages[0] is rec and not stages[1].enabled


# --------------------------------------------------------------------------------------------
# Property: what the gate certifies is what LO work keeps


_BOARDS = [
    (BIG,),
    (BIG, LITTLE),
    (BIG, _cluster("mid", 4, 2, 1.0, (1000, 2000)), _cluster("lo", 6, 2, 0.5, (500, 1000))),
]


@st.composite
def _cases(draw):
    clusters = draw(st.sampled_from(_BOARDS))
    cpus = [c for k in clusters for c in k.online]
    n = draw(st.integers(1, 5))
    jobs, settings_ = [], {}
    for i in range(n):
        pid = 100 + i
        crit = draw(st.sampled_from(["hi", "hi", "lo"]))
        deadline = draw(st.one_of(st.none(), st.floats(0.2, 3.0)))
        work = draw(st.floats(0.05, 4.0))
        span = work * draw(st.floats(0.005, 0.3))
        own = draw(st.lists(st.sampled_from(cpus), min_size=1, max_size=4, unique=True))
        jobs.append(
            JobObs(pid, f"j{pid}", crit, 0.0, 0.0, deadline, tuple(own), profile=_prof(work, span))
        )
        settings_[pid] = JobSetting(tuple(sorted(own)), draw(st.sampled_from([0, 10, 60, 90, 99])))
    freq = {k.name: draw(st.sampled_from(k.freqs_khz)) for k in clusters}
    return _obs(clusters, jobs), Decision(freq, settings_)


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_lo_work_keeps_what_the_gate_gave_it_and_stays_off_reserved_clusters(case):
    obs, proposal = case
    plan = plan_reservation(obs)
    gate = GateStage()
    stages = daemon_stages([gate])
    d = proposal
    gated = None
    for stage in stages:
        d = stage(d, obs)
        if gated is None:
            gated = d.copy()
    reserved = {c for name in plan.hi for c in obs.cluster(name).online}
    held: dict[int, list[str]] = {}
    for name, job in plan.hi.items():
        held.setdefault(job.pid, []).append(name)
    several = [pid for pid, names in held.items() if len(names) > 1]
    if several:
        # one HI job that fits no free cluster alone took every one left, together
        assert len(several) == 1 and plan.shared and len(plan.hi) == len(obs.clusters)
        job = next(j for j in obs.jobs if j.pid == several[0])
        assert fits_together(job, [obs.cluster(n) for n in held[job.pid]])
    else:
        # one cluster per HI job, one left for LO work unless the board has only one
        assert len(plan.hi_pids) == len(plan.hi) <= max(1, len(obs.clusters) - 1)
    assert plan.shared or reserved.isdisjoint(plan.lo_cpus)
    for name, job in plan.hi.items():
        cores = tuple(sorted(c for n in held[job.pid] for c in obs.cluster(n).online))
        assert d.jobs[job.pid] == JobSetting(cores, HI_RT_PRIORITY)
        assert d.freq_khz[name] >= needed_khz(job, obs.cluster(name))
    # every HI job has a cluster: its own, or one it shares above LO work
    his = {j.pid for j in obs.jobs if j.criticality == "hi"}
    assert plan.hi_pids | plan.sharer_pids == his
    sharer_rt = plan.sharer_priorities()
    above: dict[int, int] = {}  # per CPU, the lowest sharing HI job's priority
    for name, jobs in plan.shares.items():
        c = obs.cluster(name)
        assert plan.shared or name not in plan.hi
        for job in jobs:
            got = d.jobs[job.pid]
            assert got.rt_priority == sharer_rt[job.pid] and set(got.cpus) <= set(c.online)
            assert d.freq_khz[name] >= needed_khz(job, c, NEED_MARGIN)
            for cpu in got.cpus:
                above[cpu] = min(above.get(cpu, 99), sharer_rt[job.pid])
    # the cores sharing HI jobs got are theirs alone, unless they took their whole cluster
    theirs = set()
    for name, jobs in plan.shares.items():
        got = {c for job in jobs for c in d.jobs[job.pid].cpus}
        if not plan.shared and got != set(obs.cluster(name).online):
            theirs |= got
    deadline_lo = {g.pid for g in jobs_from_obs(obs)} - his
    for j in obs.jobs:
        if j.pid in his:
            continue
        got = d.jobs[j.pid]
        assert theirs.isdisjoint(got.cpus)
        assert all(got.rt_priority < above[c] for c in got.cpus if c in above)
        if not plan.shared:
            assert reserved.isdisjoint(got.cpus)
            if j.pid in deadline_lo:  # the reservation changes nothing the gate certified
                # (but a priority capped below a HI job sharing the cores)
                want = gated.jobs[j.pid]
                cap = min((above[c] for c in want.cpus if c in above), default=100)
                assert got == JobSetting(want.cpus, min(want.rt_priority, cap - 1), want.nice)
        else:
            assert got.rt_priority == 0
    for name in obs.clusters:
        if name.name not in plan.hi and name.name not in plan.shares:
            assert d.freq_khz[name.name] == gated.freq_khz[name.name]


def test_the_reservation_plans_within_the_clusters_limits():
    """A capped cluster (a thermal or static ceiling in scaling_max_freq) is planned at what
    it can get: the floor never above the cap, a job that needs more than the cap does not
    "fit" there, and the gate then sees an allowed OPP (it used to see 2000 kHz on a 1500 kHz
    cluster and fall back to its safest point)."""
    capped = replace(BIG, max_khz=1500)
    job = _job(10, "hi", 4.0, 0.1, 2.3)  # needs 1500 kHz with the margin (see above)
    assert needed_khz(job, capped, NEED_MARGIN) == 1500
    late = _job(11, "hi", 4.0, 0.1, 1.4)  # would need 2000 kHz: not there under the cap
    assert needed_khz(late, capped, NEED_MARGIN) == 1500
    assert fits(late, BIG, 1.0) and not fits(late, capped, 1.0)
    obs = _obs((capped, LITTLE), (late,))
    out = ClusterReservation()(Decision({"big": 1000, "little": 500}, {}), obs)
    assert out.freq_khz["big"] <= 1500
