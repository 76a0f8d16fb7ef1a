"""The gate's span at another operating point is an upper bound of the true critical path.

Scaling L by the job's mean memory share is not one: a path that is all compute slows by
f_ref / f, more than the mean. agents.deadlines.span_at bounds it by the compute-only and
memory-only longest paths of the profile, and without them by the worst split of L.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.deadlines import greedy_bound, profile_from_dag, span_at, work_bound
from agents.schedulability import IMPOSSIBLE, GateCluster, GateJob, requirement, requirements
from platforms.dag import DagBuilder
from platforms.sim.plant import Plant, SimJob
from platforms.spec import load_board

TX2 = load_board("tx2")
A57 = TX2.cluster("a57")
F_REF = A57.fmax_khz


def compute_beside_memory():
    """Two independent tasks: 1 s of compute at the reference clock, 1 s of memory stalls."""
    b = DagBuilder("cpu+mem")
    b.add(1.0 * F_REF * 1e3)
    b.add(0.0, mem_s=1.0)
    return b.build()


def test_a_compute_path_beside_a_memory_one_is_not_admitted_at_a_low_clock():
    """At 960 MHz the compute task alone takes f_ref / f = 2.12 s, past a 2 s deadline, so
    no core count can meet it. The mean-beta span (1.56 s) admitted it on 4 cores."""
    dag = compute_beside_memory()
    p = profile_from_dag(dag, TX2, A57, 4, F_REF, 1.0)
    low = 960_000
    true_span = dag.work_span(low * 1e3, 1.0)[1]
    assert true_span > 2.0
    assert p.span_s * (p.beta + (1 - p.beta) * F_REF / low) < 2.0  # the old estimate passed
    k = GateCluster("a57", A57.cpus, (low, F_REF), 1.0)
    job = GateJob(1, p, remaining_s=2.0)
    kind, _, _, span = requirement(job, k, low)
    assert kind == IMPOSSIBLE and span >= true_span
    # ... and the plant agrees: 4 cores at 960 MHz take longer than the deadline
    plant = Plant(TX2, seed=0, online=TX2.cpus, governor="userspace")
    for c in TX2.clusters:
        plant.set_freq(c.name, low if c.name == "a57" else c.fmax_khz)
    pid = plant.submit(SimJob(dag=dag, name="cpu+mem"))
    plant.set_affinity(pid, A57.cpus)
    plant.run_until_idle()
    js = plant.jobs[pid]
    assert js.finish_t - js.release_t > 2.0


@st.composite
def dags(draw):
    """Random DAGs of tasks with compute and memory parts in varying shares."""
    n = draw(st.integers(1, 12))
    b = DagBuilder("random")
    for i in range(n):
        cpu = draw(st.floats(0.0, 1.0))
        mem = draw(st.floats(0.0, 1.0))
        if cpu + mem < 1e-3:
            cpu = 0.5
        preds = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        b.add(cpu * F_REF * 1e3, mem_s=mem, preds=preds)
    return b.build()


@settings(max_examples=150, deadline=None)
@given(dag=dags(), remaining=st.sampled_from([1.0, 0.5, 0.1]))
def test_span_at_bounds_the_true_span_at_every_point_of_every_board(dag, remaining):
    p = profile_from_dag(dag, TX2, A57, 1, F_REF, 10.0)
    bare = dataclasses.replace(p, span_cpu_s=None, span_mem_s=None)  # measured on a board
    for board in ("tx2", "orin-nx", "rubikpi3"):
        for cl in load_board(board).clusters:
            for khz in cl.freqs_khz:
                true_span = dag.work_span(khz * 1e3, cl.capacity)[1]
                for prof in (p, bare):
                    # the whole job: at least its true span
                    assert span_at(prof, khz, cl.capacity) >= true_span * (1 - 1e-9)
                    # part of it done: the bound never exceeds the remaining work's bound
                    w_rem = work_bound(prof, khz, cl.capacity, remaining)
                    assert span_at(prof, khz, cl.capacity, remaining) <= w_rem * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(dag=dags(), deadline=st.floats(0.5, 20.0))
def test_the_table_loop_and_the_greedy_bound_use_the_same_span(dag, deadline):
    """requirements() repeats span_at term for term; greedy_bound on equal cores is Graham's
    L(f) + (C(f) - L(f)) / n with that span."""
    p = profile_from_dag(dag, TX2, A57, 1, F_REF, 10.0)
    k = GateCluster("a57", A57.cpus, tuple(A57.freqs_khz), 1.0)
    job = GateJob(1, p, remaining_s=deadline)
    for (_, _, c, span), khz in zip(requirements(job, k), k.freqs_khz):
        assert span == span_at(p, khz, 1.0)
        for n in (1, 2, 4):
            g = greedy_bound(p, [(khz, 1.0)] * n)
            assert abs(g - (span + (c - span) / n)) <= 1e-9 * max(1.0, g)


def test_the_work_left_is_bounded_whatever_its_memory_share():
    """fft's last phase is memory-bound: moved from three A57 cores to one Denver core
    (capacity 1.3) at 93 % done, the job takes longer than its remaining work at the job's
    mean memory share (work_at) predicts; work_bound, which the gate plans with, holds."""
    from agents.deadlines import work_at
    from bots_bench.dags import generate
    from bots_bench.reference import measure_reference

    den, p = TX2.cluster("denver"), measure_reference("tx2", "fft", "test", 0)
    plant = Plant(TX2, seed=0, online=TX2.cpus, governor="userspace")
    for c in TX2.clusters:
        plant.set_freq(c.name, c.fmax_khz)
    pid = plant.submit(SimJob(dag=generate("fft", "test", seed=0), name="fft"))
    plant.set_affinity(pid, A57.cpus[:3])
    plant.advance(0.14)
    done = plant.job_progress(pid)
    assert 0.5 < done < 1.0
    plant.set_affinity(pid, den.cpus[:1])
    plant.run_until_idle()
    took = plant.jobs[pid].finish_t - 0.14
    assert work_at(p, den.fmax_khz, den.capacity, 1 - done) < took  # the mean share misses
    assert work_bound(p, den.fmax_khz, den.capacity, 1 - done) >= took
    # the whole job: the bound is the estimate
    for cl in TX2.clusters:
        for khz in cl.freqs_khz:
            est, bound = work_at(p, khz, cl.capacity), work_bound(p, khz, cl.capacity)
            assert abs(bound - est) <= 1e-12 * est
            assert work_bound(p, khz, cl.capacity, 0.3) >= work_at(p, khz, cl.capacity, 0.3)
