"""higfrl at inference on inputs its candidate caps and its training did not cover: ready
tasks that fit only nodes past the node-class cap, and node sizes no training node had."""

from __future__ import annotations

import numpy as np
import pytest

from agents.placement.features import (
    CAP_CPU_MAX,
    CAP_CPU_MIN,
    N_DYN,
    N_STATIC,
    FeatureBuilder,
    LocalState,
    TeacherModel,
)
from agents.placement.higfrl import HigfrlPlacer
from agents.placement.train import DEFAULT_NODES
from platforms.cluster.alibaba import parse_batch_task
from platforms.cluster.simcluster import ClusterView, NodeSpec, Workload, simulate

COL_CAP_CPU = N_STATIC + N_DYN + 3  # node columns: speed, free cpu, free mem, size, ...


def _w(rows):
    return Workload.from_jobs(parse_batch_task(rows).jobs)


def _idle_view(w, nodes, free_cpu=None, free_mem=None):
    return ClusterView(
        t=0.0,
        workload=w,
        nodes=tuple(nodes),
        ready=np.arange(w.n_tasks),
        ready_t=np.zeros(w.n_tasks),
        free_cpu=np.array([n.cpus for n in nodes] if free_cpu is None else free_cpu, float),
        free_mem=np.array([n.mem for n in nodes] if free_mem is None else free_mem, float),
        speed=np.array([n.speed for n in nodes]),
    )


# A needs 4 cores and little memory, B half a core and 8 memory: the smallest demands (0.5
# cores, 0.1 memory) come from different tasks. 16 fast small nodes (distinct speeds, so 16
# classes: the whole cap) take those minima but neither task; 4 slow big nodes take both.
SPLIT = ["A,1,j,1,Terminated,0,10,400,0.1", "B,1,j,1,Terminated,0,10,50,8"]
SPLIT_NODES = [NodeSpec(f"fast{i}", "x", 2, 1, 2.0 + 0.1 * i) for i in range(16)] + [
    NodeSpec(f"big{i}", "x", 8, 16, 0.5) for i in range(4)
]


@pytest.mark.parametrize("model", ["shipped", "teacher"])
def test_tasks_fitting_only_nodes_past_the_class_cap_are_placed(model):
    """The capped node classes fitting the smallest demands fit no candidate: the round used
    to end with no edge and the simulation raised PlacementError on an idle cluster."""
    w = _w(SPLIT)
    placer = HigfrlPlacer() if model == "shipped" else HigfrlPlacer(model=TeacherModel())
    res = simulate(w, SPLIT_NODES, placer)
    assert [SPLIT_NODES[k].name[:3] for k in res.node] == ["big", "big"]
    assert res.makespan == pytest.approx(20.0)  # both at once, 10 s of work at speed 0.5


@pytest.mark.parametrize("seed", range(40))
def test_a_build_has_an_edge_whenever_a_ready_task_fits_a_node(seed):
    """Random clusters with more node classes than the cap and tasks whose core and memory
    demands pull apart: every build has at least one start edge while some ready task fits
    some free node, and every start edge fits."""
    rng = np.random.default_rng(seed)
    n_t = int(rng.integers(1, 12))
    rows = []
    for k in range(n_t):
        cpu = float(rng.choice([25, 50, 100, 200, 400, 800]))
        mem = float(rng.choice([0.05, 0.2, 1.0, 4.0, 8.0]))
        rows.append(f"M1,1,j{k},1,Terminated,0,{int(rng.integers(1, 50))},{cpu:.0f},{mem}")
    w = _w(rows)
    n_n = int(rng.integers(2, 40))
    nodes = [
        NodeSpec(
            f"n{i}",
            "x",
            float(rng.choice([1, 2, 4, 8, 16])),
            float(rng.choice([0.5, 1.0, 2.0, 8.0, 16.0])),
            float(rng.uniform(0.3, 3.0)),
        )
        for i in range(n_n)
    ]
    free_cpu = np.array([n.cpus for n in nodes]) * rng.choice([0.25, 0.5, 1.0], n_n)
    free_mem = np.array([n.mem for n in nodes]) * rng.choice([0.25, 0.5, 1.0], n_n)
    view = _idle_view(w, nodes, free_cpu, free_mem)
    fb = FeatureBuilder(max_tasks=4, max_node_classes=int(rng.integers(1, 6)))
    fb.reset(w, nodes)
    state = LocalState(view)
    while True:
        _, pt, pn, pp, pw, _ = fb.build(state)
        ready = view.ready[~state.taken]
        fits = (view.cpu[ready, None] <= state.free_cpu[None, :] + 1e-9) & (
            view.mem[ready, None] <= state.free_mem[None, :] + 1e-9
        )
        start = ~pw
        assert bool(start.any()) == bool(fits.any())
        if not start.any():
            break
        task, node = pt[start], pn[start]
        assert np.all(view.cpu[task] <= state.free_cpu[node] + 1e-9)
        assert np.all(view.mem[task] <= state.free_mem[node] + 1e-9)
        e = int(np.flatnonzero(start)[0])
        state.commit(int(pt[e]), int(pn[e]), int(pp[e]))


def test_node_size_feature_is_cores_over_8_clipped_to_the_trained_span():
    """Training nodes have 4 (tx2) or 8 (orin-nx, rubikpi3) cores: cores / 8 in 0.5..1.0 is
    passed through bit for bit, a smaller or larger node saturates at the nearest end."""
    from platforms.cluster.simcluster import parse_nodes_spec

    trained = sorted({n.cpus for n in parse_nodes_spec(DEFAULT_NODES)})
    assert (CAP_CPU_MIN, CAP_CPU_MAX) == (trained[0] / 8.0, trained[-1] / 8.0)
    sizes = [1, 2, 3, 4, 5, 6, 7, 8, 12, 64, 128]
    nodes = [NodeSpec(f"n{c}", "x", c, 16, 1.0) for c in sizes]
    w = _w(["M1,1,j,1,Terminated,0,5,100,0.5"])
    fb = FeatureBuilder(max_node_classes=len(nodes))
    fb.reset(w, nodes)
    x, _, pn, _, pw, _ = fb.build(LocalState(_idle_view(w, nodes)))
    got = dict(zip((sizes[k] for k in pn[~pw]), x[~pw, COL_CAP_CPU].tolist()))
    assert sorted(got) == sizes
    for c in (4, 5, 6, 7, 8):
        assert got[c] == np.float32(c / 8.0)
    assert [got[c] for c in (1, 2, 3)] == [0.5] * 3
    assert [got[c] for c in (12, 64, 128)] == [1.0] * 3


@pytest.mark.parametrize("cpus", [8, 16, 64, 128])
@pytest.mark.parametrize("speed", [2.0, 9.0])
def test_a_big_fast_node_wins_over_a_small_slow_one(cpus, speed):
    """A node with more cores than any training node fed the actor cores / 8 = 8 or 16 and
    the shipped model sent the task to a node 4-18x slower."""
    w = _w(["M1,1,j,1,Terminated,0,5,100,0.5"])
    nodes = [NodeSpec("big", "x", cpus, 16, speed), NodeSpec("slow", "x", 4, 8, 0.5)]
    res = simulate(w, nodes, HigfrlPlacer())
    assert nodes[int(res.node[0])].name == "big"
    assert res.makespan == pytest.approx(5.0 / speed)
