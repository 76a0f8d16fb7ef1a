"""agents.deadlines.greedy_bound: a job's response time on cores of unequal speed."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.deadlines import greedy_bound, slowdown, span_within, work_at
from platforms.dag import make_dag
from platforms.observation import JobProfile
from platforms.sim.params import parse_sim
from platforms.sim.plant import Plant, SimJob
from platforms.spec import load_board

RUBIK = load_board("rubikpi3")


def profile(work=2.0, span=0.3, beta=0.2) -> JobProfile:
    return JobProfile("j", work, span, beta, 1.0, 2_000_000, 4)


def test_on_equal_cores_it_is_grahams_bound():
    p = profile()
    for n, rem in ((1, 1.0), (3, 0.6), (8, 0.05)):
        c = work_at(p, 1_500_000, 0.8, rem)
        span = span_within(p, 1_500_000, 0.8, c)
        assert greedy_bound(p, [(1_500_000, 0.8)] * n, rem) == pytest.approx(span + (c - span) / n)


def test_no_cores_no_bound():
    assert greedy_bound(profile(), []) == math.inf


cores = st.lists(
    st.tuples(st.integers(300_000, 3_000_000), st.floats(0.2, 2.0)), min_size=1, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(
    cores=cores,
    extra=st.tuples(st.integers(300_000, 3_000_000), st.floats(0.2, 2.0)),
    work=st.floats(0.01, 10.0),
    span_frac=st.floats(0.0, 1.0),
    beta=st.floats(0.0, 0.9),
    rem=st.floats(0.01, 1.0),
)
def test_it_is_above_what_any_schedule_needs_and_a_core_at_least_as_fast_never_raises_it(
    cores, extra, work, span_frac, beta, rem
):
    p = profile(work, work * span_frac, beta)
    b = greedy_bound(p, cores, rem)
    phis = [slowdown(beta, p.ref_khz, f, c) for f, c in cores]
    w, span = rem * work, min(p.span_s, rem * work)
    assert b >= w / sum(1 / x for x in phis) * (1 - 1e-9)  # all cores busy all the time
    assert b >= span * min(phis) * (1 - 1e-9)  # the critical path on the fastest core
    slowest = max(phis)
    if slowdown(beta, p.ref_khz, *extra) <= slowest:
        assert greedy_bound(p, [*cores, extra], rem) <= b * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_it_bounds_the_simulated_run_on_gold_and_silver_cores(seed):
    """The plant's task runtime (greedy, untied tasks) on a mix of the two core types."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 120))
    dst = [i for i in range(1, n) if rng.random() < 0.7]
    src = [int(rng.integers(0, i)) for i in dst]
    cycles = rng.uniform(1e6, 1e8, n)
    dag = make_dag("g", cycles, cycles * rng.uniform(0, 1e-9), src, dst)  # uniform beta
    params = dataclasses.replace(parse_sim(RUBIK), exec_jitter=0.0)
    plant = Plant(RUBIK, params=params, governor="userspace")
    gold, silver = RUBIK.cluster("gold"), RUBIK.cluster("silver")
    fg, fs = int(rng.choice(gold.freqs_khz)), int(rng.choice(silver.freqs_khz))
    ng, ns = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    plant.set_freq("gold", fg)
    plant.set_freq("silver", fs)
    pid = plant.submit(SimJob(dag, "g"))
    plant.set_affinity(pid, gold.cpus[:ng] + silver.cpus[:ns])
    plant.run_until_idle()
    work, span = dag.work_span(gold.freqs_khz[-1] * 1e3, 1.0)
    p = JobProfile("g", work, min(span, work), float(dag.mem_s.sum()) / work, 1.0,
                   gold.freqs_khz[-1], 1)  # fmt: skip
    bound = greedy_bound(p, [(fg, gold.capacity)] * ng + [(fs, silver.capacity)] * ns)
    assert plant.jobs[pid].makespan_s <= bound * (1 + 1e-6)
