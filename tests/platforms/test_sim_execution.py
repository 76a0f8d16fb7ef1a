"""Plant execution model: makespan bounds, frequency monotonicity, determinism, sharing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from platforms.bounds import makespan_bounds
from platforms.dag import DAG, DagBuilder, make_dag
from platforms.sim.params import parse_sim
from platforms.sim.plant import Plant, SimJob
from platforms.spec import load_board

TX2 = load_board("tx2")
A57 = TX2.cluster("a57")
NO_JITTER = dataclasses.replace(parse_sim(TX2), exec_jitter=0.0)


# -- DAG shapes ---------------------------------------------------------------------------------


def chain(rng, n=30, mem=0.0) -> DAG:
    b = DagBuilder("chain")
    prev: tuple[int, ...] = ()
    for _ in range(n):
        prev = (b.add(rng.uniform(1e6, 2e7), mem * rng.uniform(0, 1e-3), prev),)
    return b.build()


def independent(rng, n=60, mem=0.0) -> DAG:
    b = DagBuilder("independent")
    for _ in range(n):
        b.add(rng.uniform(1e6, 2e7), mem * rng.uniform(0, 1e-3))
    return b.build()


def fork_join(rng, width=7, depth=4, mem=0.0) -> DAG:
    b = DagBuilder("forkjoin")
    join = b.add(rng.uniform(1e5, 1e6))
    for _ in range(depth):
        forks = [
            b.add(rng.uniform(1e6, 3e7), mem * rng.uniform(0, 1e-3), (join,)) for _ in range(width)
        ]
        join = b.add(rng.uniform(1e5, 1e6), 0.0, forks)
    return b.build()


def layered(rng, layers=6, width=9, p=0.3, mem=0.0) -> DAG:
    b = DagBuilder("layered")
    prev: list[int] = []
    for _ in range(layers):
        cur = []
        for _ in range(int(rng.integers(1, width + 1))):
            preds = [q for q in prev if rng.random() < p]
            cur.append(b.add(rng.uniform(1e6, 2e7), mem * rng.uniform(0, 1e-3), preds))
        prev = cur
    return b.build()


def fib_tree(rng, depth=6, mem=0.0) -> DAG:
    """Recursive spawn/sync shape (fib-like): a node spawns two children and a join."""
    b = DagBuilder("fib")

    def rec(d, pred):
        node = b.add(rng.uniform(1e5, 1e6), 0.0, pred)
        if d == 0:
            return b.add(rng.uniform(1e6, 1e7), mem * rng.uniform(0, 1e-3), (node,))
        left = rec(d - 1, (node,))
        right = rec(d - 1, (node,))
        return b.add(rng.uniform(1e5, 1e6), 0.0, (left, right))

    rec(depth, ())
    return b.build()


def random_dag(rng, n=80, mem=0.0) -> DAG:
    src, dst = [], []
    for i in range(1, n):
        for q in set(rng.integers(max(0, i - 12), i, size=int(rng.integers(0, 3))).tolist()):
            src.append(q)
            dst.append(i)
    return make_dag("random", rng.uniform(1e6, 2e7, n), mem * rng.uniform(0, 1e-3, n), src, dst)


SHAPES = [chain, independent, fork_join, layered, fib_tree, random_dag]


def run_alone(dag: DAG, khz: int, m: int, *, seed=0, params=NO_JITTER) -> tuple[Plant, int]:
    """Run ``dag`` alone on the first ``m`` A57 cores pinned at ``khz``."""
    plant = Plant(TX2, seed=seed, params=params, governor="userspace")
    plant.set_freq("a57", khz)
    plant.advance(0.01)  # let the transition latency pass
    assert plant.freq_khz("a57") == khz
    pid = plant.submit(SimJob(dag, dag.name))
    plant.set_affinity(pid, A57.cpus[:m])
    plant.run_until_idle()
    return plant, pid


# -- makespan between the lower bound and Graham's bound ---------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("khz,m", [(2035200, 4), (960000, 3), (345600, 2), (1420800, 1)])
@pytest.mark.parametrize("mem", [0.0, 1.0])
def test_makespan_between_lower_and_graham_bounds(shape, khz, m, mem):
    rng = np.random.default_rng(hash((shape.__name__, khz, m, mem)) % 2**32)
    dag = shape(rng, mem=mem)
    plant, pid = run_alone(dag, khz, m)
    st_ = plant.jobs[pid]
    b = makespan_bounds(dag, khz * 1e3, A57.capacity, m)
    assert st_.done and st_.done_tasks == dag.n
    assert b.lower_s * (1 - 1e-9) <= st_.makespan_s <= b.graham_s * (1 + 1e-9)
    # the job used only its m cores: CPU time equals the work
    assert st_.busy_s == pytest.approx(b.work_s, rel=1e-9)


def test_one_core_makespan_equals_work():
    dag = layered(np.random.default_rng(3))
    plant, pid = run_alone(dag, 1267200, 1)
    assert plant.jobs[pid].makespan_s == pytest.approx(dag.work_span(1267200e3)[0], rel=1e-12)


def test_chain_makespan_equals_span_on_any_core_count():
    dag = chain(np.random.default_rng(4), mem=1.0)
    plant, pid = run_alone(dag, 652800, 4)
    assert plant.jobs[pid].makespan_s == pytest.approx(dag.work_span(652800e3)[1], rel=1e-12)


# -- frequency monotonicity ---------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    i=st.integers(0, len(A57.freqs_khz) - 1),
    j=st.integers(0, len(A57.freqs_khz) - 1),
    m=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    shape=st.sampled_from(SHAPES),
)
def test_lower_frequency_never_reduces_compute_bound_makespan(i, j, m, seed, shape):
    lo, hi = sorted((A57.freqs_khz[i], A57.freqs_khz[j]))
    dag = shape(np.random.default_rng(seed))  # compute-bound: mem_s == 0
    p_lo, pid_lo = run_alone(dag, lo, m)
    p_hi, pid_hi = run_alone(dag, hi, m)
    assert p_lo.jobs[pid_lo].makespan_s >= p_hi.jobs[pid_hi].makespan_s * (1 - 1e-9)


def test_memory_time_does_not_scale_with_frequency():
    b = DagBuilder("mem")
    b.add(0.0, 0.25)
    dag = b.build()
    for khz in (345600, 2035200):
        plant, pid = run_alone(dag, khz, 1)
        assert plant.jobs[pid].makespan_s == pytest.approx(0.25)


# -- DVFS timing --------------------------------------------------------------------------------


def test_frequency_change_applies_after_transition_latency_and_retimes_running_tasks():
    b = DagBuilder("one")
    b.add(2035200e3 * 1.0)  # 1 s at fmax on an A57
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    pid = plant.submit(SimJob(b.build(), "one"))
    plant.set_affinity(pid, (0,))
    plant.advance(0.5)
    plant.set_freq("a57", 1017600)  # not a table entry: snaps to 960000 (at or below)
    lat = A57.transition_latency_ns * 1e-9
    plant.advance(0.5 + lat / 2)
    assert plant.freq_khz("a57") == 2035200
    plant.advance(0.5 + lat)
    assert plant.freq_khz("a57") == 960000
    plant.run_until_idle()
    done_at_switch = (0.5 + lat) / 1.0
    expected = 0.5 + lat + (1 - done_at_switch) * 2035200 / 960000
    assert plant.jobs[pid].makespan_s == pytest.approx(expected, rel=1e-9)


def test_advance_stops_at_release_and_completion():
    dag = independent(np.random.default_rng(5), n=8)
    plant = Plant(TX2, params=NO_JITTER)
    pid = plant.submit(SimJob(dag, "late", release_t=0.3))
    assert plant.advance(10.0) == pytest.approx(0.3)
    assert plant.events == [(pytest.approx(0.3), "release", pid)]
    t_done = plant.advance(10.0)
    assert t_done == plant.jobs[pid].finish_t < 10.0
    assert plant.events[-1] == (t_done, "finish", pid)
    assert plant.advance(t_done - 0.1) == t_done  # the past: nothing to do
    assert plant.advance(t_done + 1.0) == pytest.approx(t_done + 1.0)


def test_submit_in_the_past_releases_now_and_empty_dag_finishes_at_once():
    plant = Plant(TX2)
    plant.advance(1.0)
    pid = plant.submit(SimJob(DagBuilder("empty").build(), "empty", release_t=0.0))
    assert plant.jobs[pid].release_t == 1.0 and plant.jobs[pid].makespan_s == 0.0
    assert [e[1] for e in plant.events] == ["release", "finish"]


def test_cyclic_dag_is_reported_not_hung():
    dag = make_dag("cycle", [1e6, 1e6], [0.0, 0.0], [0, 1], [1, 0])
    plant = Plant(TX2)
    plant.submit(SimJob(dag, "cycle"))
    with pytest.raises(RuntimeError, match="no progress"):
        plant.run_until_idle()


# -- determinism ---------------------------------------------------------------------------------


def _campaign(seed: int) -> tuple:
    rng = np.random.default_rng(11)
    plant = Plant(TX2, seed=seed, online=TX2.cpus)
    pids = [
        plant.submit(SimJob(shape(rng, mem=1.0), shape.__name__, release_t=0.05 * k))
        for k, shape in enumerate(SHAPES)
    ]
    plant.set_priority(pids[2], rt_priority=10)
    plant.run_until_idle()
    return (
        tuple(plant.jobs[p].makespan_s for p in pids),
        tuple(plant.events),
        plant.energy_j,
        tuple(plant.temps_c().values()),
    )


def test_same_seed_same_result_and_seed_changes_jitter():
    a, b, c = _campaign(1), _campaign(1), _campaign(2)
    assert a == b
    assert a[0] != c[0]


def test_jitter_is_what_the_realised_dag_shows():
    dag = independent(np.random.default_rng(6), n=50)
    plant = Plant(TX2, seed=3, governor="userspace")
    pid = plant.submit(SimJob(dag, "j"))
    plant.set_affinity(pid, (0,))
    plant.run_until_idle()
    real = plant.job_dag(pid)
    assert not np.allclose(real.cycles, dag.cycles)
    assert plant.jobs[pid].makespan_s == pytest.approx(real.work_span(2035200e3)[0], rel=1e-9)


# -- sharing between jobs -------------------------------------------------------------------------


def _two_jobs(setup) -> tuple[float, float, float]:
    dag = independent(np.random.default_rng(7), n=40)
    alone, _ = run_alone(dag, 2035200, 4)
    t_alone = alone.jobs[10000].makespan_s
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    a = plant.submit(SimJob(dag, "a"))
    b = plant.submit(SimJob(dag, "b"))
    setup(plant, a, b)
    plant.run_until_idle()
    return t_alone, plant.jobs[a].makespan_s, plant.jobs[b].makespan_s


def test_equal_priority_jobs_share_cores_fairly():
    t, ta, tb = _two_jobs(lambda p, a, b: None)
    assert ta == pytest.approx(tb, rel=0.05)
    assert ta == pytest.approx(2 * t, rel=0.05)


def test_higher_rt_priority_wins_shared_cores():
    t, ta, tb = _two_jobs(lambda p, a, b: p.set_priority(b, rt_priority=50))
    assert tb == pytest.approx(t, rel=1e-9)
    assert ta == pytest.approx(2 * t, rel=0.05)


@pytest.mark.parametrize("shape", [fork_join, fib_tree, layered], ids=lambda f: f.__name__)
def test_a_higher_rt_priority_job_preempts_for_tasks_that_become_ready_later(shape):
    """SCHED_FIFO preempts on wakeup: the high job's tasks that become ready mid-run take
    cores from a lower-priority job at once. The lower job used to keep them task after
    task, and a job at rt 50 ran on one core of four."""
    dag = shape(np.random.default_rng(3))
    alone, pid = run_alone(dag, 2035200, 4)
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    plant.set_freq("a57", 2035200)
    plant.advance(0.01)
    hog = plant.submit(SimJob(independent(np.random.default_rng(4), n=400), "hog"))
    plant.set_affinity(hog, A57.cpus)
    plant.advance(0.02)
    high = plant.submit(SimJob(dag, "high"))
    plant.set_affinity(high, A57.cpus)
    plant.set_priority(high, rt_priority=50)
    plant.run_until_idle()
    assert plant.jobs[high].makespan_s == pytest.approx(alone.jobs[pid].makespan_s, rel=1e-9)


@given(
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 10_000),
    others=st.lists(
        st.tuples(st.sampled_from(SHAPES), st.floats(0.0, 0.05), st.integers(0, 49)),
        min_size=1,
        max_size=3,
    ),
    arrive=st.floats(0.0, 0.05),
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_top_priority_job_runs_as_if_alone(shape, seed, others, arrive):
    """Whatever lower-priority jobs share its cores, and whenever they arrive, the job with
    the highest SCHED_FIFO priority finishes exactly when it would alone."""
    dag = shape(np.random.default_rng(seed))
    alone, pid = run_alone(dag, 2035200, 4)
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    plant.set_freq("a57", 2035200)
    plant.advance(0.01)
    t0 = plant.t
    for i, (other, at, rt) in enumerate(others):
        o = plant.submit(
            SimJob(other(np.random.default_rng(seed + i + 1)), "low", release_t=t0 + at)
        )
        plant.set_affinity(o, A57.cpus)
        plant.set_priority(o, rt_priority=rt)
    top = plant.submit(SimJob(dag, "top", release_t=t0 + arrive))
    plant.set_affinity(top, A57.cpus)
    plant.set_priority(top, rt_priority=50)
    plant.run_until_idle()
    assert plant.jobs[top].makespan_s == pytest.approx(alone.jobs[pid].makespan_s, rel=1e-9)


def test_nice_weights_the_share():
    t, ta, tb = _two_jobs(lambda p, a, b: p.set_priority(a, 0, nice=5))
    assert tb < ta and tb < 1.6 * t


def test_disjoint_affinity_jobs_do_not_interfere():
    def setup(p, a, b):
        p.set_affinity(a, (0, 3))
        p.set_affinity(b, (4, 5))

    t, ta, tb = _two_jobs(setup)
    dag = independent(np.random.default_rng(7), n=40)
    b = makespan_bounds(dag, 2035200e3, 1.0, 2)
    for x in (ta, tb):  # each behaves as alone on its two cores
        assert b.lower_s <= x <= b.graham_s


def test_offline_cpu_moves_its_tasks_and_affinity_change_migrates():
    rng = np.random.default_rng(8)
    dag = make_dag("long", rng.uniform(1e8, 3e8, 40), np.zeros(40), [], [])  # ~1.3 s on 4 cores
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    pid = plant.submit(SimJob(dag, "x"))
    plant.advance(0.2)
    assert set(plant.job_running_cpus(pid)) == {0, 3, 4, 5}
    plant.set_online(5, False)
    assert 5 not in plant.job_running_cpus(pid)
    plant.set_affinity(pid, (0, 3))
    plant.advance(plant.t + 0.05)
    assert set(plant.job_running_cpus(pid)) <= {0, 3}
    plant.run_until_idle()
    work = dag.work_span(2035200e3)[0]
    assert plant.jobs[pid].busy_s == pytest.approx(work, rel=1e-9)  # no work lost or duplicated
    assert plant.jobs[pid].done_tasks == dag.n


def test_an_affinity_or_priority_change_leaves_running_tasks_where_they_are_allowed():
    """The kernel leaves a running thread on its CPU when the new mask still holds it. The
    plant used to re-place every running task from the lowest-numbered core up: a job given
    one more (slower) core had its running task moved onto it, a critical path too."""
    rng = np.random.default_rng(3)
    dag = chain(rng, n=5)
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    pid = plant.submit(SimJob(dag, "c"))
    plant.set_affinity(pid, (4,))
    plant.advance(0.001)
    assert plant.job_running_cpus(pid) == (4,)
    plant.set_affinity(pid, (0, 4))  # 0 is free and comes first
    assert plant.job_running_cpus(pid) == (4,)
    plant.set_priority(pid, 50)
    assert plant.job_running_cpus(pid) == (4,)
    plant.set_affinity(pid, (0, 3))  # 4 is no longer allowed: the task moves
    assert plant.job_running_cpus(pid) == (0,)
    plant.run_until_idle()
    assert plant.jobs[pid].busy_s == pytest.approx(dag.work_span(2035200e3)[0], rel=1e-9)


@pytest.mark.parametrize(
    ("board", "ntasks", "first"),
    [("tx2", 1, {1}), ("tx2", 2, {1, 2}), ("rubikpi3", 1, {7}), ("rubikpi3", 4, {4, 5, 6, 7})],
)
def test_free_cores_are_taken_biggest_first(board, ntasks, first):
    """A busy thread of a job allowed everywhere lands on the biggest free cores (the
    kernel's capacity-aware placement moves a CPU-bound thread off a little core), not on
    the lowest-numbered ones, which are the little cores of every board here."""
    spec = load_board(board)
    dag = independent(np.random.default_rng(4), n=ntasks)
    plant = Plant(spec, governor="userspace", online=spec.cpus)
    pid = plant.submit(SimJob(dag, "i"))
    assert set(plant.job_running_cpus(pid)) == first


# -- progress: the share of the work done, as a job profile counts work ------------------------


def test_progress_counts_work_not_tasks():
    """A chain of a 1 s task and three 1/3 s ones (at fmax on an A57): after 1.5 s, 1.5 of
    its 2 s of work are done, though only one task of four is."""
    b = DagBuilder("uneven")
    f = 2035200e3
    t0 = b.add(f * 1.0)
    t1 = b.add(f / 3, 0.0, (t0,))
    t2 = b.add(f / 3, 0.0, (t1,))
    b.add(f / 3, 0.0, (t2,))
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    pid = plant.submit(SimJob(b.build(), "uneven", release_t=0.5))
    plant.set_affinity(pid, (0,))
    assert plant.job_progress(pid) == 0.0  # not released yet
    plant.advance(0.5)
    plant.advance(2.0)
    assert plant.jobs[pid].done_tasks == 2
    assert plant.job_progress(pid) == pytest.approx(0.75, rel=1e-9)
    plant.run_until_idle()
    assert plant.job_progress(pid) == 1.0


def test_progress_keeps_an_evicted_task_s_done_part():
    b = DagBuilder("one")
    b.add(2035200e3 * 1.0, 0.25)  # 1 s of compute and 0.25 s of stall at fmax
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    low = plant.submit(SimJob(b.build(), "low"))
    plant.set_affinity(low, (0,))
    plant.advance(0.5)
    before = plant.job_progress(low)
    assert before == pytest.approx(0.4, rel=1e-9)
    hog = plant.submit(SimJob(independent(np.random.default_rng(1), n=4), "hog"))
    plant.set_affinity(hog, (0,))
    plant.set_priority(hog, rt_priority=50)  # evicts low's task mid-way
    assert plant.job_running_cpus(low) == ()
    assert plant.job_progress(low) == pytest.approx(before, rel=1e-9)
    plant.run_until_idle()
    assert plant.job_progress(low) == 1.0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from(SHAPES),
    moves=st.lists(st.tuples(st.floats(0.001, 0.05), st.integers(1, 63)), max_size=6),
)
def test_progress_only_grows_and_ends_at_one(seed, shape, moves):
    """Under frequency, affinity and sharing changes the share of work done never falls."""
    rng = np.random.default_rng(seed)
    plant = Plant(TX2, seed=seed, governor="userspace", online=TX2.cpus)
    pid = plant.submit(SimJob(shape(rng, mem=1.0), "x"))
    plant.submit(SimJob(shape(rng), "other"))
    last = plant.job_progress(pid)
    for dt, mask in moves:
        plant.advance(plant.t + dt)
        now = plant.job_progress(pid)
        assert 0.0 <= last <= now + 1e-12 <= 1.0 + 1e-12
        last = now
        plant.set_affinity(pid, tuple(c for c in TX2.cpus if mask >> c & 1) or (0,))
        plant.set_freq("a57", A57.freqs_khz[mask % len(A57.freqs_khz)])
    plant.run_until_idle()
    assert plant.job_progress(pid) == 1.0


def test_taking_an_idle_cpu_offline_books_no_busy_time_nor_energy():
    """An idle core going offline closes no busy stretch: it used to book its whole idle
    time as busy, and the per-busy-core rail loads charged it."""
    plant = Plant(TX2, params=NO_JITTER, governor="userspace")
    plant.advance(10.0)
    busy, e = plant.cpu_busy_s(5), plant.energy_j
    assert busy == 0.0
    plant.set_online(5, False)
    assert plant.cpu_busy_s(5) == 0.0
    plant.advance(10.01)
    e_off = plant.energy_j - e
    plant.set_online(5, True)
    plant.advance(10.02)
    assert plant.cpu_busy_s(5) == 0.0
    total_idle_w = plant.power_w()[0]  # all cores online and idle
    assert 0.0 < e_off <= total_idle_w * 0.01 + 1e-12  # one core less, no fake busy load


def test_denver_cores_run_faster_by_their_capacity():
    dag = independent(np.random.default_rng(9), n=10)
    plant = Plant(TX2, params=NO_JITTER, governor="userspace", online=TX2.cpus)
    pid = plant.submit(SimJob(dag, "d"))
    plant.set_affinity(pid, (1,))
    plant.run_until_idle()
    assert plant.jobs[pid].makespan_s == pytest.approx(dag.work_span(2035200e3, 1.3)[0], rel=1e-9)


def test_invalid_requests_name_the_cause():
    plant = Plant(TX2)
    pid = plant.submit(SimJob(independent(np.random.default_rng(1), n=3), "x"))
    with pytest.raises(ValueError, match="invalid CPU set"):
        plant.set_affinity(pid, (42,))
    with pytest.raises(ValueError, match="none of CPUs"):
        plant.set_affinity(pid, (1, 2))  # Denver offline by default
    with pytest.raises(ValueError, match="rt_priority"):
        plant.set_priority(pid, 100)
    with pytest.raises(KeyError):
        plant.set_priority(99, 1)
    with pytest.raises(ValueError, match="cpu0"):
        plant.set_online(0, False)
    with pytest.raises(ValueError, match="pins"):
        Plant(TX2, governor="performance").set_freq("a57", 960000)
    with pytest.raises(ValueError, match="no governor"):
        Plant(load_board("rubikpi3"), governor="powersave")  # modular, not loaded
