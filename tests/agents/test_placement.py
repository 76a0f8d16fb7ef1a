"""Placement heuristics, the higfrl features and model, its ONNX export and training."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agents.placement.features import (
    COL_IS_WAIT,
    COL_LOG_WORK,
    FEATURE_VERSION,
    N_GLOBAL,
    N_PAIR,
    FeatureBuilder,
    LocalState,
    TeacherModel,
    hypergraph_propagate,
    static_features,
    teacher_choice,
    topological_prior,
)
from agents.placement.heuristics import HeftPlacer, make_heuristic
from agents.placement.higfrl import DEFAULT_MODEL, HigfrlPlacer
from agents.placement.onnx_mlp import Mlp, NumpyPolicyModel, OnnxPolicyModel
from agents.placement.train import TrainConfig, evaluate, export, summarize, train
from platforms.cluster.alibaba import parse_batch_task
from platforms.cluster.simcluster import ClusterView, NodeSpec, Workload, simulate


def _w(rows):
    return Workload.from_jobs(parse_batch_task(rows).jobs)


def _view(w, nodes, ready, free_cpu, running=(), finish=(), on=1):
    run_node = np.full(w.n_tasks, -1)
    fe = np.full(w.n_tasks, np.inf)
    for t, f in zip(running, finish):
        run_node[t] = on
        fe[t] = f
    return ClusterView(
        t=0.0,
        workload=w,
        nodes=tuple(nodes),
        ready=np.array(ready),
        ready_t=np.zeros(w.n_tasks),
        free_cpu=np.array(free_cpu, dtype=float),
        free_mem=np.array([n.mem for n in nodes]),
        speed=np.array([n.speed for n in nodes]),
        run_node=run_node,
        finish_est=fe,
        running=np.array(running, dtype=np.int64),
    )


ROWS = [
    "M1,1,j,1,Terminated,0,50,100,0.1",  # long root of a chain
    "R2_1,1,j,1,Terminated,50,100,100,0.1",
    "M3,1,j,1,Terminated,0,2,100,0.1",  # short independent task
]
SLOW_FAST = [NodeSpec("slow", "x", 1, 4, 1.0), NodeSpec("fast", "x", 1, 4, 2.0)]


def test_rank_u_is_the_longest_path_to_an_exit():
    w = _w(ROWS)
    assert w.rank_u.tolist() == [100.0, 50.0, 2.0]


@pytest.mark.parametrize(
    "name, first",
    [
        ("sjf", ("M3", "fast")),
        ("cp", ("M1", "fast")),
        ("fifo", ("M1", "fast")),
        ("heft", ("M1", "fast")),
    ],
)
def test_list_policies_pick_their_task_first(name, first):
    w = _w(ROWS)
    p = make_heuristic(name)
    p.reset(w, SLOW_FAST, 0)
    out = p.place(_view(w, SLOW_FAST, [0, 2], [1, 1]))
    task, node = out[0]
    assert (w.task_names[task], SLOW_FAST[node].name) == first


def test_heft_holds_a_critical_task_for_a_busy_fast_node():
    # fast node busy until t=1; M1 (50 s) finishes at 1 + 25 there, at 50 on the slow node
    w = _w(ROWS)
    p = HeftPlacer()
    p.reset(w, SLOW_FAST, 0)
    view = _view(w, SLOW_FAST, [0], [1, 0], running=[2], finish=[1.0])
    assert p.place(view) == []
    eager = HeftPlacer(hold=False)
    eager.reset(w, SLOW_FAST, 0)
    assert eager.place(view) == [(0, 0)]


def test_tetris_prefers_the_aligned_node():
    w = _w(["M1,1,j,1,Terminated,0,5,200,2.0"])
    nodes = [NodeSpec("small", "x", 2, 2, 1.0), NodeSpec("big", "x", 8, 16, 1.0)]
    p = make_heuristic("tetris")
    p.reset(w, nodes, 0)
    scores = p.node_scores(_view(w, nodes, [0], [2, 8]), 0)
    assert scores[0] > scores[1]  # the task fills the small node exactly


def test_static_hypergraph_features():
    w = _w(ROWS)
    x = np.column_stack([np.arange(3.0)])
    (h1,) = hypergraph_propagate(w, x, hops=1)
    # M1 and R2_1 share both hyperedges; M3 is isolated and keeps its own value
    assert h1[0, 0] == pytest.approx(0.5) and h1[1, 0] == pytest.approx(0.5) and h1[2, 0] == 2.0
    assert static_features(w).shape == (3, 16)


def _held_fast_node_pairs():
    """ROWS on SLOW_FAST with M1 ready, the fast node busy until t = 1: the pairs built."""
    w = _w(ROWS)
    fb = FeatureBuilder()
    fb.reset(w, SLOW_FAST)
    view = _view(w, SLOW_FAST, [0], [1, 0], running=[2], finish=[1.0])
    return (w, *fb.build(LocalState(view)))


def test_pairs_include_wait_edges_and_prior():
    w, x, pt, pn, pp, pw, g = _held_fast_node_pairs()
    assert x.shape == (2, N_PAIR) and g.shape == (N_GLOBAL,)
    assert set(zip(pn.tolist(), pw.tolist())) == {
        (0, False),
        (1, True),
    }  # start on slow, or wait for fast
    prior = topological_prior(x)
    assert prior[pw].item() > prior[~pw].item()  # holding the critical task for its best node


def test_shipped_model_loads_with_provenance():
    m = OnnxPolicyModel(DEFAULT_MODEL)
    for key in (
        "seed",
        "command",
        "date",
        "train_config",
        "feature_version",
        "git_commit",
    ):
        assert m.metadata.get(key), key
    assert m.metadata["command"].startswith("hidvfs coordinator train --seed ")
    assert (m.n_pair, m.n_global) == (N_PAIR, N_GLOBAL)
    x = np.random.default_rng(0).normal(size=(7, N_PAIR)).astype(np.float32)
    assert m.logits(x).shape == (7,)


def test_onnx_export_matches_numpy(tmp_path):
    rng = np.random.default_rng(1)
    mean, std = rng.normal(size=N_PAIR), rng.uniform(0.5, 2, size=N_PAIR)
    gm, gs = rng.normal(size=N_GLOBAL), rng.uniform(0.5, 2, size=N_GLOBAL)
    model = NumpyPolicyModel(
        Mlp.init([N_PAIR, 8, 1], rng, out_scale=1.0),
        Mlp.init([N_GLOBAL, 4, 1], rng, 1.0),
        mean,
        std,
        gm,
        gs,
    )
    path = tmp_path / "m.onnx"
    meta = {"seed": "1", "command": "test", "date": "2024-01-01T00:00:00+00:00"}
    model.export(path, meta | {"feature_version": str(FEATURE_VERSION)})
    onx = OnnxPolicyModel(path)
    x = rng.normal(size=(5, N_PAIR)).astype(np.float32)
    np.testing.assert_allclose(onx.logits(x), model.logits(x), rtol=1e-4, atol=1e-4)
    g = rng.normal(size=N_GLOBAL).astype(np.float32)
    assert onx.value(g) == pytest.approx(model.value(g), rel=1e-4, abs=1e-4)
    probs = onx.session.run(["probs"], {"pairs": x, "context": g[None]})[0]
    assert probs.sum() == pytest.approx(1.0, abs=1e-5)


def test_backprop_matches_finite_differences():
    rng = np.random.default_rng(2)
    net = Mlp.init([3, 5, 1], rng, out_scale=1.0)
    x = rng.normal(size=(4, 3))
    out, acts = net.forward_cache(x)
    (gw0, gb0), (gw1, _) = net.backward(acts, np.ones_like(out))
    eps = 1e-6
    w0 = net.layers[0][0]
    w0[1, 2] += eps
    up = net.forward(x).sum()
    w0[1, 2] -= 2 * eps
    down = net.forward(x).sum()
    w0[1, 2] += eps
    assert gw0[1, 2] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-7)


def test_tiny_training_runs_and_is_deterministic(tmp_path):
    cfg = TrainConfig(
        seed=3,
        iterations=2,
        rollouts=2,
        jobs_per_episode=4,
        hidden=(8,),
        critic_hidden=(4,),
        val_every=1,
        val_jobs=4,
        val_loads=(0.9,),
    )
    m1, h1 = train(cfg)
    m2, h2 = train(cfg)
    assert h1 == h2
    for (a, b), (c, d) in zip(m1.actor.layers, m2.actor.layers):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
    m3, _ = train(TrainConfig(**{**cfg.__dict__, "seed": 4}))
    assert not np.array_equal(m1.actor.layers[0][0], m3.actor.layers[0][0])
    # the returned model is the validated checkpoint with the lowest score
    scores = [h["val_score"] for h in h1]
    assert m1.selected == {"iter": int(np.argmin(scores)), "val_score": min(scores)}
    path = tmp_path / "tiny.onnx"
    export(m1, path, cfg, "test", "2024-01-01T00:00:00+00:00", h1)
    onx = OnnxPolicyModel(path)
    assert onx.metadata["seed"] == "3"
    assert json.loads(onx.metadata["selected_checkpoint"])["iter"] == m1.selected["iter"]
    res = simulate(_w(ROWS), SLOW_FAST, HigfrlPlacer(model=onx))
    assert np.isfinite(res.finish).all()


def test_higfrl_node_scores_rank_the_fast_node():
    w = _w(["M1,1,j,1,Terminated,0,50,100,0.1"])
    p = HigfrlPlacer()
    p.reset(w, SLOW_FAST, 0)
    s = p.node_scores(_view(w, SLOW_FAST, [0], [1, 1]), 0)
    assert np.isfinite(s).all()
    s_busy = p.node_scores(_view(w, SLOW_FAST, [0], [1, 0]), 0)
    assert np.isneginf(s_busy[1]) and np.isfinite(s_busy[0])


def test_evaluation_function_shape():
    rows = evaluate(n_jobs=6, loads=(0.8,), seeds=(7,), policies=("higfrl", "sjf", "heft"))
    summary = summarize(rows)
    assert {r["policy"] for r in summary} == {"higfrl", "sjf", "heft"}
    best = min(r["mean_flow_s"] for r in summary if r["policy"] != "higfrl")
    for r in summary:
        assert r["flow_vs_best"] == pytest.approx(r["mean_flow_s"] / best)


def test_teacher_takes_the_critical_chain_first_and_holds_it_for_the_fast_node():
    # the long chain (M1) sets the horizon: the teacher holds it for the busy fast node
    w, x, pt, pn, _, pw, _ = _held_fast_node_pairs()
    a = teacher_choice(x)
    assert (w.task_names[pt[a]], SLOW_FAST[pn[a]].name, bool(pw[a])) == ("M1", "fast", True)


def test_teacher_is_shortest_first_off_the_critical_chain():
    # two independent short tasks behind a long running chain: shortest first, fast node
    w = _w(
        [
            "M1,1,j,1,Terminated,0,400,100,0.1",
            "M2,1,k,1,Terminated,0,9,100,0.1",
            "M3,1,k,1,Terminated,0,3,100,0.1",
        ]
    )
    nodes = [
        NodeSpec("slow", "x", 2, 4, 1.0),
        NodeSpec("fast", "x", 2, 4, 2.0),
        NodeSpec("big", "x", 1, 4, 1.0),
    ]
    fb = FeatureBuilder()
    fb.reset(w, nodes)
    run_node = np.full(3, -1)
    run_node[0] = 2
    fe = np.full(3, np.inf)
    fe[0] = 400.0
    view = ClusterView(
        t=0.0,
        workload=w,
        nodes=tuple(nodes),
        ready=np.array([1, 2]),
        ready_t=np.zeros(3),
        free_cpu=np.array([2.0, 2.0, 0.0]),
        free_mem=np.array([4.0, 4.0, 4.0]),
        speed=np.array([1.0, 2.0, 1.0]),
        run_node=run_node,
        finish_est=fe,
        running=np.array([0]),
    )
    x, pt, pn, _, pw, _ = fb.build(LocalState(view))
    a = teacher_choice(x)
    assert (w.task_names[pt[a]], nodes[pn[a]].name, bool(pw[a])) == ("M3", "fast", False)


def test_teacher_model_places_a_valid_schedule():
    w = _w(ROWS)
    res = simulate(w, SLOW_FAST, HigfrlPlacer(model=TeacherModel()))
    assert np.isfinite(res.finish).all()
    # the critical chain runs on the fast node
    assert res.node[0] == 1 and res.node[1] == 1


def _fresh_copy(s: LocalState) -> LocalState:
    """The same round state as ``s`` (placements, holds), with no cached view or epoch."""
    f = LocalState(s.view)
    f.free_cpu, f.free_mem = s.free_cpu.copy(), s.free_mem.copy()
    f.n_running = s.n_running
    f.placed, f.held = list(s.placed), list(s.held)
    f.taken, f.reserved = s.taken.copy(), s.reserved.copy()
    return f


@pytest.mark.parametrize(
    "spec, holds", [("tx2:4,orin-nx:2,rubikpi3:2", True), ("tx2:40,orin-nx:30,rubikpi3:30", False)]
)
def test_cached_features_after_holds_and_commits_equal_a_fresh_build(spec, holds):
    """The view and epoch caches that make a hold cheap change no feature: every decision of
    a sampled rollout (holds included; on 100 nodes, more node classes than the cap) sees
    the pairs a cache-free build would give."""
    from platforms.cluster.simcluster import capacity, parse_nodes_spec
    from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace

    nodes = parse_nodes_spec(spec)
    cfg = SyntheticConfig(n_jobs=60, seed=11, load=1.5, capacity=capacity(nodes))
    w = Workload.from_jobs(synthetic_trace(cfg).jobs)

    class HoldsOften(TeacherModel):
        def logits(self, pairs):
            return 2.0 * pairs[:, COL_IS_WAIT] - pairs[:, COL_LOG_WORK]

    placer = HigfrlPlacer(model=HoldsOften(), greedy=False)
    fb = placer.features
    checked = {"holds": 0, "builds": 0}

    def select(state):
        ref = fb.build(_fresh_copy(state))
        got = fb.build(state)
        for a, b in zip(got[:5], ref[:5]):
            np.testing.assert_array_equal(a, b)
        if ref[5] is not None:
            np.testing.assert_array_equal(got[5], ref[5])
        checked["builds"] += 1
        checked["holds"] += len(state.held)
        return HigfrlPlacer.select(placer, state)

    placer.select = select
    res = simulate(w, nodes, placer, seed=3)
    assert np.isfinite(res.finish).all()
    assert checked["builds"] > 50
    assert checked["holds"] > 0 or not holds


def test_holds_reuse_the_scoring_of_the_round_and_never_pick_a_taken_task_or_reserved_node():
    """A hold changes no free capacity, so the next decision takes the best remaining edge of
    the same scoring: fewer actor calls than decisions, and every decision is still legal
    (task untaken, node not reserved, a start fits the node now, a wait targets a busy one)."""
    from platforms.cluster.simcluster import capacity, parse_nodes_spec
    from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace

    nodes = parse_nodes_spec("tx2:6,orin-nx:3,rubikpi3:3")
    cfg = SyntheticConfig(n_jobs=40, seed=5, load=1.5, capacity=capacity(nodes))
    w = Workload.from_jobs(synthetic_trace(cfg).jobs)
    calls = {"logits": 0, "decisions": 0, "holds": 0}

    class HoldsOften(TeacherModel):
        def logits(self, pairs):
            calls["logits"] += 1
            return 2.0 * pairs[:, COL_IS_WAIT] - pairs[:, COL_LOG_WORK]

    placer = HigfrlPlacer(model=HoldsOften(), record=True)

    def place(view):
        state = LocalState(view)
        while (pick := placer.select(state)) is not None:
            task, node, pos, wait = pick
            calls["decisions"] += 1
            assert view.ready[pos] == task and not state.taken[pos]
            assert not state.reserved[node]
            fits = (
                state.free_cpu[node] >= view.cpu[task] - 1e-9
                and state.free_mem[node] >= view.mem[task] - 1e-9
            )
            assert fits != wait
            if wait:
                calls["holds"] += 1
                state.hold(task, node, pos)
            else:
                state.commit(task, node, pos)
        return state.placed

    placer.place = place
    res = simulate(w, nodes, placer, seed=1)
    assert np.isfinite(res.finish).all()
    assert calls["holds"] > 10
    assert calls["logits"] < calls["decisions"] - calls["holds"] // 2
    # what training sees: every recorded decision is an argmax of its own (reduced) pairs
    tr = placer.trajectory
    for x, a in zip(tr.x, tr.action):
        lg = 2.0 * x[:, COL_IS_WAIT] - x[:, COL_LOG_WORK]
        assert lg[a] == lg.max()


@pytest.mark.parametrize("policy", ["higfrl", "fifo", "sjf", "cp", "heft", "tetris", "random"])
def test_every_placer_takes_a_view_without_nodes(policy):
    """The extender may be asked about no nodes: reset raised max() of an empty sequence
    (higfrl), tetris and the list policies a zero-size reduction."""
    w = _w(["M1,1,j,1,Terminated,0,50,100,0.1"])
    p = HigfrlPlacer() if policy == "higfrl" else make_heuristic(policy)
    p.reset(w, [], 0)
    view = _view(w, [], [0], [])
    assert p.node_scores(view, 0).size == 0 and p.place(view) == []


FAST_SLOW = [NodeSpec("F", "x", 4, 8, 2.0), NodeSpec("S", "x", 4, 8, 0.01)]


def test_heft_fits_a_short_task_in_the_gap_before_a_held_task_starts():
    """A 4-core task waits for the fast node (busy to t=10); a 2-core 1 s task fits there now
    and ends long before: HEFT's insertion gap runs it there, not on a node 200x slower."""
    w = _w(
        [
            "M1,1,a,1,Terminated,0,20,200,1",  # 2 cores on F until t=10
            "M1,1,b,1,Terminated,1,201,400,1",  # 4 cores, work 200: held for F
            "M2,1,b,1,Terminated,1,3,200,1",  # 2 cores, work 2
        ]
    )
    r = simulate(w, FAST_SLOW, make_heuristic("heft"))
    assert r.node.tolist() == [0, 0, 0]
    assert r.makespan == pytest.approx(110.0)


def test_heft_counts_a_task_placed_earlier_in_the_round_as_released_at_its_finish():
    """Two 4-core tasks at once, one fast node: the second waits for the first (finish 15),
    not for ever (it went to a node 200x slower: finish 1000)."""
    w = _w(["M1,1,j,1,Terminated,0,20,400,1", "M2,1,j,1,Terminated,0,10,400,1"])
    r = simulate(w, FAST_SLOW, make_heuristic("heft"))
    assert r.node.tolist() == [0, 0]
    assert r.makespan == pytest.approx(15.0)
