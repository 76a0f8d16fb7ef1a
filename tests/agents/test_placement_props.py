"""Every placement policy produces schedules that respect dependencies and capacity."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.placement.heuristics import HEURISTICS, make_heuristic
from agents.placement.higfrl import HigfrlPlacer
from platforms.cluster.simcluster import (
    NodeSpec,
    PiecewiseSpeed,
    SimResult,
    Workload,
    makespan_lower_bound,
    simulate,
)
from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace

POLICIES = ("higfrl", *HEURISTICS)
_HIGFRL = HigfrlPlacer()  # loads the shipped ONNX model once


def placer(name: str):
    return _HIGFRL if name == "higfrl" else make_heuristic(name)


def violations(res: SimResult) -> list[str]:
    """Independent check of a finished schedule."""
    w = res.workload
    out = []
    if not (np.isfinite(res.start).all() and np.isfinite(res.finish).all()):
        out.append("unfinished tasks")
        return out
    if (res.node < 0).any():
        out.append("task without a node")
    if (res.start < w.job_arrival[w.task_job] - 1e-9).any():
        out.append("task started before its job arrived")
    for t in range(w.n_tasks):
        for p in w.predecessors(t).tolist():
            if res.start[t] < res.finish[p] - 1e-9:
                out.append(
                    f"task {t} started at {res.start[t]} before parent {p} finished at {res.finish[p]}"
                )
    for k, node in enumerate(res.nodes):
        on = np.flatnonzero((res.node == k) & (res.finish > res.start))
        ev = sorted(
            [(res.start[i], 1, i) for i in on] + [(res.finish[i], 0, i) for i in on]
        )  # release first
        cpu = mem = 0.0
        for _, kind, i in ev:
            sign = 1 if kind else -1
            cpu += sign * res.cpu[i]
            mem += sign * res.mem[i]
            if cpu > node.cpus + 1e-6 or mem > node.mem + 1e-6:
                out.append(f"node {node.name} over capacity ({cpu:g} cores, {mem:g} mem)")
                break
    return out


node_st = st.builds(
    lambda cpus, mem, speed, throttle: NodeSpec(
        "n",
        "x",
        float(cpus),
        float(mem),
        speed,
        speed_fn=PiecewiseSpeed((0.0, throttle), (1.0, 0.5)) if throttle else None,
    ),
    st.integers(2, 8),
    st.sampled_from([2.0, 4.0, 8.0]),
    st.floats(0.5, 2.0),
    st.one_of(st.none(), st.floats(1.0, 200.0)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 100_000),
    n_jobs=st.integers(1, 10),
    load=st.floats(0.3, 3.0),
    nodes=st.lists(node_st, min_size=1, max_size=4),
)
def test_every_policy_respects_dependencies_and_capacity(seed, n_jobs, load, nodes):
    nodes = [
        NodeSpec(f"n{i}", n.board, n.cpus, n.mem, n.speed, n.speed_fn) for i, n in enumerate(nodes)
    ]
    cap = sum(n.cpus * n.speed for n in nodes)
    w = Workload.from_jobs(
        synthetic_trace(SyntheticConfig(n_jobs=n_jobs, seed=seed, load=load, capacity=cap)).jobs
    )
    for name in POLICIES:
        res = simulate(w, nodes, placer(name), seed=seed)
        assert violations(res) == [], name
        assert res.makespan >= 0 and res.mean_wait >= 0
        assert res.mean_flow >= res.mean_wait
        # throttling only slows nodes, so the nominal-speed bound holds for every schedule
        assert res.makespan >= makespan_lower_bound(w, nodes, res.cpu) - 1e-6, name


def test_checker_catches_a_broken_schedule():
    w = Workload.from_jobs(synthetic_trace(SyntheticConfig(n_jobs=3, seed=1)).jobs)
    nodes = [NodeSpec("n0", "x", 4.0, 8.0, 1.0)]
    res = simulate(w, nodes, make_heuristic("fifo"))
    child = int(np.flatnonzero(w.npred > 0)[0]) if (w.npred > 0).any() else None
    broken = SimResult(
        res.policy,
        w,
        res.nodes,
        res.start.copy(),
        res.finish,
        res.node,
        res.ready_t,
        res.cpu * 100,
        res.mem,
        0,
        0,
    )
    assert violations(broken)  # capacity
    if child is not None:
        early = res.start.copy()
        early[child] = -1.0
        bad = SimResult(
            res.policy,
            w,
            res.nodes,
            early,
            res.finish,
            res.node,
            res.ready_t,
            res.cpu,
            res.mem,
            0,
            0,
        )
        assert violations(bad)
