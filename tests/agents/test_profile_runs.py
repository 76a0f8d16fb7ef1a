"""Reference profiles of real programs: from three timed runs, and the daemon's store lookup."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents import deadlines
from agents.deadlines import ProfileStore, profile_from_runs
from daemon.profiles import ProfileLookup
from platforms.observation import JobProfile


def model_time(c, span, beta, cores, capacity, khz, ref_khz):
    """The gate's own models: Graham on n cores, two-point frequency scaling."""
    return (span + (c - span) / cores) * ((1 - beta) * ref_khz / (capacity * khz) + beta)


@given(
    c=st.floats(0.05, 50.0),
    frac=st.floats(0.01, 1.0),
    beta=st.floats(0.0, 1.0),
    cores=st.integers(1, 8),
    capacity=st.sampled_from([0.6, 1.0, 1.4]),
)
def test_three_runs_recover_the_model_they_were_made_with(c, frac, beta, cores, capacity):
    span = c * frac if cores > 1 else c
    ref, low = 2_000_000, 1_000_000
    p = profile_from_runs(
        "job",
        ref_khz=ref,
        low_khz=low,
        cores=cores,
        capacity=capacity,
        t_all_s=model_time(c, span, beta, cores, capacity, ref, ref),
        t_one_s=model_time(c, c, beta, 1, capacity, ref, ref),
        t_low_s=model_time(c, span, beta, cores, capacity, low, ref),
    )
    assert p.beta == pytest.approx(beta, abs=1e-6)
    assert p.work_s == pytest.approx(c, rel=1e-6)
    if cores > 1:
        assert p.span_s == pytest.approx(span, rel=1e-6, abs=1e-6 * c)
    assert p.ref_cores == cores and p.ref_khz == ref


def test_noisy_runs_are_clipped_into_a_valid_profile():
    # all cores slower than one core, low frequency faster than the top: noise, not physics
    p = profile_from_runs(
        "noisy",
        ref_khz=2000,
        low_khz=1000,
        cores=4,
        capacity=1.0,
        t_all_s=1.2,
        t_one_s=1.0,
        t_low_s=1.1,
    )
    assert p.span_s == pytest.approx(p.work_s) and p.beta == 1.0
    with pytest.raises(ValueError, match="t_one_s"):
        profile_from_runs(
            "x",
            ref_khz=2000,
            low_khz=1000,
            cores=4,
            capacity=1.0,
            t_all_s=1.0,
            t_one_s=0.0,
            t_low_s=1.0,
        )
    with pytest.raises(ValueError, match="low_khz"):
        profile_from_runs(
            "x",
            ref_khz=2000,
            low_khz=2000,
            cores=4,
            capacity=1.0,
            t_all_s=1.0,
            t_one_s=2.0,
            t_low_s=1.0,
        )


def prof(name="fib", version=1, work=2.0):
    return JobProfile(name, work, 0.5, 0.1, 1.0, 2035200, 4, version)


def test_lookup_rereads_a_changed_store_and_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "profiles.json"
    errors = []
    look = ProfileLookup(path, "tx2", on_error=errors.append)
    assert look("fib") is None and len(look) == 0  # no file yet: no profiles, no error
    store = ProfileStore()
    store.put("tx2", prof())
    store.put("orin-nx", prof(work=3.0))
    deadlines.save(store, path)
    assert look("fib") == prof() and len(look) == 1  # its board only
    path.write_text("{not json")
    assert look("fib") == prof() and errors and "valid JSON" in errors[0]
    store.put("tx2", prof(work=2.5), replace_existing=True)
    deadlines.save(store, path)
    assert look("fib").version == 2 and look("fib").work_s == 2.5


def test_a_bad_store_fails_the_start(tmp_path):
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(Exception, match="format"):
        ProfileLookup(path, "tx2")


def test_a_slowdown_beyond_the_frequency_ratio_is_compute_bound():
    p = profile_from_runs(
        "x",
        ref_khz=2000,
        low_khz=1000,
        cores=2,
        capacity=0.6,
        t_all_s=1.0,
        t_one_s=1.8,
        t_low_s=5.0,
    )
    assert p.beta == 0.0


def test_progress_estimate_is_the_least_work_a_greedy_schedule_can_have_done():
    from agents.deadlines import PROGRESS_CAP, ProgressEstimate

    p = JobProfile("j", 4.0, 1.0, 0.0, 2.0, 2_000_000, 4)  # C = 4 s, L = 1 s at 2 GHz
    est = ProgressEstimate()
    assert est.advance(1, p, 10.0, 2_000_000, 1.0, 4) == 0.0  # first sight: nothing known
    # 0.875 s on 4 cores may all have been the critical path: one core's work, 0.875 / 4
    assert est.advance(1, p, 10.875, 2_000_000, 1.0, 4) == pytest.approx(0.21875)
    # then 0.875 s at half the frequency (C = 8, L = 2): the path's last 0.125 takes 0.25 s
    # on one core (0.25 / 8), the other 0.625 s all four cores work (4 x 0.625 / 8)
    assert est.advance(1, p, 11.75, 1_000_000, 1.0, 4) == pytest.approx(0.5625)
    assert est.advance(1, p, 100.0, 2_000_000, 1.0, 4) == PROGRESS_CAP  # overran: capped
    est.forget(1)
    assert est.advance(1, p, 200.0, 2_000_000, 1.0, 4) == 0.0
    # on one core nothing is lost to the path: the work done is the time run
    assert est.advance(2, p, 0.0, 2_000_000, 1.0, 1) == 0.0
    assert est.advance(2, p, 1.0, 2_000_000, 1.0, 1) == pytest.approx(0.25)


def _chain_then_branches(f_khz: float, chain_s: float, branches: int, branch_s: float):
    from platforms.dag import DagBuilder

    b, prev, seg = DagBuilder("cp"), (), 40
    for _ in range(seg):
        prev = (b.add(chain_s / seg * f_khz * 1e3, 0.0, prev),)
    for _ in range(branches):
        q = prev
        for _ in range(seg):
            q = (b.add(branch_s / seg * f_khz * 1e3, 0.0, q),)
    return b.build()


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_the_estimate_never_runs_ahead_of_the_plants_progress(cores):
    """A serial phase, then parallel branches: the estimate by the Graham time credited
    68 % at 54 % done, and the gate then kept one core for a job that needed two."""
    from agents.deadlines import ProgressEstimate, span_at, work_at
    from agents.policy import Decision, JobSetting, Policy
    from daemon.simrun import run_sim
    from platforms.sim.plant import SimJob
    from platforms.spec import load_board

    spec = load_board("orin-nx")
    top = spec.clusters[0]
    dag = _chain_then_branches(top.fmax_khz, 1.5, 3, 0.6)
    c, span = dag.work_span(top.fmax_khz * 1e3, 1.0)
    prof = JobProfile("cp", c, span, 0.0, c, top.fmax_khz, 4)

    class Fixed(Policy):
        name, period_s = "fixed", 0.05

        def decide(self, obs):
            cl = obs.clusters[0]
            return Decision(
                {k.name: k.freqs_khz[-1] for k in obs.clusters},
                {j.pid: JobSetting(tuple(cl.cpus[:cores])) for j in obs.jobs},
            )

    est, seen = ProgressEstimate(), []

    def on_tick(res):
        for j in res.obs.jobs:
            if j.progress is not None and j.cpus:
                guess = est.advance(j.pid, prof, res.t, top.fmax_khz, top.capacity, len(j.cpus))
                seen.append((j.progress, guess))

    run_sim("orin-nx", Fixed(), [(SimJob(dag, "cp", 100.0), prof)], seed=0, on_tick=on_tick)
    assert len(seen) > 20
    assert all(guess <= true + 1e-6 for true, guess in seen), max(g - t for t, g in seen)
    assert work_at(prof, top.fmax_khz, top.capacity) == pytest.approx(c)
    assert span_at(prof, top.fmax_khz, top.capacity) >= span - 1e-9


def test_jobs_sharing_a_pool_are_credited_their_share_not_the_whole_pool():
    """Two parallel jobs pinned to the same two cores (the gate's light pools): each credited
    both cores ran ahead of the plant (0.90 at 0.58 done); at its share of them, not."""
    from agents.deadlines import ProgressEstimate
    from agents.policy import Decision, JobSetting, Policy
    from daemon.loop import core_shares
    from daemon.simrun import run_sim
    from platforms.dag import DagBuilder
    from platforms.sim.plant import SimJob
    from platforms.spec import load_board

    top = load_board("orin-nx").clusters[0]

    def parallel(name, branches=4, branch_s=0.8, seg=20):
        b = DagBuilder(name)
        for _ in range(branches):
            q = ()
            for _ in range(seg):
                q = (b.add(branch_s / seg * top.fmax_khz * 1e3, 0.0, q),)
        return b.build()

    class Shared(Policy):
        name, period_s = "shared", 0.05

        def decide(self, obs):
            cl = obs.clusters[0]
            return Decision(
                {k.name: k.freqs_khz[-1] for k in obs.clusters},
                {j.pid: JobSetting(tuple(cl.cpus[:2])) for j in obs.jobs},
            )

    items = []
    for n in ("a", "b"):
        dag = parallel(n)
        c, span = dag.work_span(top.fmax_khz * 1e3, 1.0)
        items.append((SimJob(dag, n, 100.0), JobProfile(n, c, span, 0.0, c, top.fmax_khz, 4)))
    prof = {p.name: p for _, p in items}
    est, whole, seen = ProgressEstimate(), ProgressEstimate(), []

    def on_tick(res):
        running = [j for j in res.obs.jobs if j.progress is not None and j.cpus]
        shares = core_shares([j.cpus for j in running], res.obs)
        for j, share in zip(running, shares):
            p = prof[j.name]
            guess = est.advance(j.pid, p, res.t, top.fmax_khz, top.capacity, share)
            pool = whole.advance(j.pid, p, res.t, top.fmax_khz, top.capacity, len(j.cpus))
            seen.append((j.progress, guess, pool, share))

    run_sim("orin-nx", Shared(), items, seed=0, on_tick=on_tick)
    assert any(share == pytest.approx(1.0) for *_, share in seen)  # two jobs, two cores
    assert len(seen) > 20
    # fair sharing is an approximation (the plant's time slices are not exactly even), so a
    # small lead is allowed; credited the whole pool, the estimate led by a third of the work
    assert max(guess - true for true, guess, _, _ in seen) < 0.01
    assert max(pool - true for true, _, pool, _ in seen) > 0.2


def test_the_loop_estimates_progress_where_the_board_reports_none(tmp_path):
    import subprocess
    import sys
    import time

    from agents.governors import make_governor
    from daemon.jobs import JobEntry
    from daemon.loop import ControlLoop
    from platforms.clock import MonotonicClock
    from platforms.faketree import write_fake_tree
    from platforms.liveprocs import LiveProcessControl
    from platforms.platform import Platform
    from platforms.spec import load_board
    from platforms.sysfs import DirSysfs

    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    clock = MonotonicClock()
    loop = ControlLoop(
        Platform(spec, DirSysfs(tmp_path), LiveProcessControl(), clock, kind="fake"),
        make_governor("maxfreq"),
        period_s=0.1,
    )
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        prof = JobProfile("sleeper", 2.0, 0.5, 0.0, 1.0, 2035200, 4)
        loop.jobs.register(JobEntry(job.pid, "sleeper", clock.now(), 5.0, "lo", prof))
        loop.jobs.register(JobEntry(job.pid + 10**6, "ghost", clock.now(), 5.0, "lo", None))
        seen = []
        for _ in range(3):
            obs, _ = loop.observe()
            seen.append(next(j.progress for j in obs.jobs if j.pid == job.pid))
            time.sleep(0.15)
    finally:
        job.kill()
        job.wait()
    assert seen[0] == 0.0 and 0.0 < seen[1] < seen[2] <= 0.9


def test_core_shares_count_online_cpus_only():
    """A fake or recorded backend's mask may name offline CPUs: two jobs masked to all six
    TX2 CPUs with Denver offline share the four A57s (2 each), not six (3 each)."""
    from daemon.loop import core_shares
    from platforms.observation import ClusterObs, Observation

    a57 = ClusterObs("a57", 0, (0, 3, 4, 5), (0, 3, 4, 5), (1, 2), 1.0, 2, 1, 2, "userspace")
    denver = ClusterObs("denver", 1, (1, 2), (), (1, 2), 1.2, None, None, None, None)
    obs = Observation(0.0, "tx2", (a57, denver), (), ())
    assert core_shares([tuple(range(6))] * 2, obs) == [2.0, 2.0]
    # no mask: every online CPU; CPU 5 is the unmasked job's alone
    assert core_shares([(0, 3), (), (4,)], obs) == pytest.approx([1.0, 2.5, 0.5])
    assert core_shares([], obs) == []
