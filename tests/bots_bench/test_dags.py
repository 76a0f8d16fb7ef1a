"""DAG models of the 12 BOTS kernels: shape per kernel, caps, determinism, calibration."""

from __future__ import annotations

from collections import deque
from functools import cache, lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bots_bench.dags as dags
from bots_bench.dags import _bnb, calibration, fib, knapsack, nqueens, sparselu
from bots_bench.dags._graph import Recorder

ALL = [(k, c) for k in dags.KERNELS for c in dags.CLASSES[k]]


@cache
def dag_of(kernel: str, cls: str = "small", seed: int = 0, variant: str | None = None):
    return dags.generate(kernel, cls, seed=seed, variant=variant)


def succ(dag, i: int) -> list[int]:
    return dag.successors(i).tolist()


@lru_cache(maxsize=64)
def preds(dag) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(dag.n)]
    for v in range(dag.n):
        for s in dag.successors(v).tolist():
            out[s].append(v)
    return out


def role(dag) -> np.ndarray:
    return dag.meta["role"]


def depth_from_roots(dag) -> np.ndarray:
    """Edges from the first root, counted along spawn edges (breadth-first)."""
    depth = np.full(dag.n, -1)
    depth[0] = 0
    q = deque([0])
    while q:
        v = q.popleft()
        for s in succ(dag, v):
            if depth[s] < 0 and role(dag)[s] != "join":
                depth[s] = depth[v] + 1
                q.append(s)
    return depth


def join_of(dag, spawn: int) -> int:
    joins = [s for s in succ(dag, spawn) if role(dag)[s] == "join"]
    assert len(joins) == 1, f"spawn {spawn} has joins {joins}"
    return joins[0]


# ---------------------------------------------------------------------------- all kernels


def test_kernel_and_class_tables():
    assert dags.KERNELS == (
        "alignment", "concom", "fft", "fib", "floorplan", "health",
        "knapsack", "nqueens", "sort", "sparselu", "strassen", "uts",
    )  # fmt: skip
    for k in dags.KERNELS:
        assert dags.CLASSES[k][:2] == ("test", "small"), k


@pytest.mark.parametrize("kernel,cls", ALL)
def test_every_dag_is_acyclic_capped_and_labelled(kernel, cls):
    dag = dags.generate(kernel, cls)
    order = dag.topo_order()
    assert sorted(order.tolist()) == list(range(dag.n))
    assert 1 < dag.n <= dags.MAX_TASKS
    assert len(role(dag)) == dag.n
    assert np.all(dag.cycles > 0) and np.all(dag.mem_s >= 0)
    assert dag.meta["kernel"] == kernel and dag.meta["class"] == cls


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_same_seed_same_dag(kernel):
    a = dags.generate(kernel, "test", seed=7)
    b = dags.generate(kernel, "test", seed=7)
    assert np.array_equal(a.cycles, b.cycles) and np.array_equal(a.mem_s, b.mem_s)
    assert np.array_equal(a.succ_idx, b.succ_idx) and np.array_equal(a.succ_ptr, b.succ_ptr)


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_seed_changes_only_noise_unless_the_input_is_random(kernel):
    a = dags.generate(kernel, "test", seed=1)
    b = dags.generate(kernel, "test", seed=2)
    same_shape = a.n == b.n and np.array_equal(a.succ_idx, b.succ_idx)
    if kernel in ("uts", "concom"):
        assert not same_shape, "a random input must change with the seed"
    else:
        assert same_shape, "a fixed input must give a fixed task graph"
        assert not np.array_equal(a.cycles, b.cycles), "per-task noise must follow the seed"
        ratio = a.cycles.sum() / b.cycles.sum()
        assert 0.95 < ratio < 1.05


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_small_estimate_within_factor_two_of_target(kernel):
    est = dags.estimate_makespan(dag_of(kernel))
    target = calibration.TARGET_S[kernel]
    assert target / 2 <= est <= 2 * target, f"{kernel}: {est:.3g} s vs target {target} s"


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_test_class_is_much_smaller(kernel):
    est = dags.estimate_makespan(dag_of(kernel, "test"))
    assert est < 0.5
    assert est < dags.estimate_makespan(dag_of(kernel)) / 2


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_classes_grow(kernel):
    ests = [dags.estimate_makespan(dag_of(kernel, c)) for c in dags.CLASSES[kernel]]
    assert ests == sorted(ests), dict(zip(dags.CLASSES[kernel], ests, strict=True))


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_parallel_kernels_have_parallelism(kernel):
    work, span = dag_of(kernel).work_span(dags.F_REF_HZ)
    assert work / span > 2


@pytest.mark.parametrize(
    "kernel,lo,hi",
    [(k, 0.0, 0.12) for k in ("fib", "nqueens", "knapsack", "uts", "floorplan", "alignment")]
    + [(k, 0.2, 0.6) for k in ("sort", "fft", "sparselu", "strassen", "health", "concom")],
)
def test_memory_bound_fraction_at_fmax(kernel, lo, hi):
    dag = dag_of(kernel)
    beta = dag.mem_s.sum() / dag.task_time(dags.F_REF_HZ).sum()
    assert lo <= beta <= hi


def test_memory_time_makes_low_frequency_less_than_proportionally_slower():
    dag = dag_of("health")
    fast = dag.task_time(dags.F_REF_HZ).sum()
    slow = dag.task_time(dags.F_REF_HZ / 2).sum()
    assert 1.3 < slow / fast < 1.6  # beta ~0.55: 0.45 * 2 + 0.55 = 1.45


def test_serial_variant_is_one_task_with_the_work():
    par = dag_of("fib", "test")
    ser = dags.generate("fib", "test", variant="serial")
    assert ser.n == 1 and ser.meta["variant"] == "serial"
    saved = par.cycles.sum() - ser.cycles.sum()
    assert saved == pytest.approx(par.n * dags._graph.TASK_OVERHEAD_S * dags.F_REF_HZ)
    assert ser.mem_s.sum() == pytest.approx(par.mem_s.sum())


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(dags.UnknownDagModel, match=r"unknown kernel 'fibb'; known: alignment, "):
        dags.generate("fibb")
    with pytest.raises(ValueError, match=r"unknown class 'tiny' for kernel 'fib'; known: test"):
        dags.generate("fib", "tiny")
    with pytest.raises(ValueError, match=r"unknown variant 'for' for kernel 'fib'"):
        dags.generate("fib", variant="for")
    with pytest.raises(ValueError, match="unknown kernel"):
        dags.describe("nope")
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        dags.generate("fib", "test", seed=-1)


@pytest.mark.parametrize("kernel", dags.KERNELS)
def test_describe_names_structure_classes_and_target(kernel):
    text = dags.describe(kernel)
    assert text.startswith(kernel + ":")
    for cls in dags.CLASSES[kernel]:
        assert f"{cls}:" in text
    assert f"{calibration.TARGET_S[kernel]:.2f} s" in text


# ---------------------------------------------------------------------------- fib


def fib_leaves(n: int, d: int, cutoff: int) -> int:
    if n < 2 or d >= cutoff:
        return 1
    return fib_leaves(n - 1, d + 1, cutoff) + fib_leaves(n - 2, d + 1, cutoff)


def check_fib_tree(dag, v: int, n: int, d: int, cutoff: int) -> int:
    """Walk the DAG from ``v`` as fib(n) at depth d; return the task that ends the call."""
    r = role(dag)
    if n < 2 or d >= cutoff:
        assert r[v] == "leaf", (v, n, d)
        return v
    assert r[v] == "spawn"
    s = succ(dag, v)
    assert len(s) == 3, "spawn -> fib(n-1), fib(n-2), join"
    j = join_of(dag, v)
    a, b = [x for x in s if x != j]
    ends = {
        check_fib_tree(dag, a, n - 1, d + 1, cutoff),
        check_fib_tree(dag, b, n - 2, d + 1, cutoff),
    }
    assert set(preds(dag)[j]) == {v} | ends
    return j


@pytest.mark.parametrize("cls", dags.CLASSES["fib"])
def test_fib_is_a_binary_tree_with_joins(cls):
    dag = dag_of("fib", cls)
    p = fib.CLASSES[cls]
    cutoff = dag.meta["model"]["effective_cutoff"]
    assert cutoff <= p["cutoff"]
    end = check_fib_tree(dag, 0, p["n"], 0, cutoff)
    assert succ(dag, end) == []
    r = role(dag)
    assert (r == "leaf").sum() == fib_leaves(p["n"], 0, cutoff)
    assert (r == "spawn").sum() == (r == "join").sum()


def test_fib_leaf_work_follows_the_call_count():
    dag = dag_of("fib", "small", variant="serial")
    leaves = dags.generate("fib", "small")
    total_calls = fib.calls(40)
    assert leaves.meta["model"]["calls"] == total_calls
    per_call = dag.cycles.sum() / total_calls
    assert per_call == pytest.approx(
        fib.CALL_S * calibration.SCALE["fib"] * dags.F_REF_HZ * (1 - fib.BETA), rel=0.02
    )


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 22), cutoff=st.integers(1, 9))
def test_fib_tree_invariants(n, cutoff):
    rec = Recorder("fib")
    fib.build(rec, {"n": n, "cutoff": cutoff}, "omp-tasks", np.random.default_rng(0))
    dag = rec.build(scale=1.0, rng=np.random.default_rng(0), meta={})
    dag.topo_order()
    assert (role(dag) == "leaf").sum() == fib_leaves(n, 0, cutoff)
    assert fib.calls(n) == (1 if n < 2 else fib.calls(n - 1) + fib.calls(n - 2) + 1)


# ---------------------------------------------------------------------------- nqueens


def brute_nodes(n: int) -> tuple[int, int]:
    """(valid partial placements incl. the empty board, solutions) by plain backtracking."""

    def go(row: int, cols: int, d1: int, d2: int) -> tuple[int, int]:
        if row == n:
            return 1, 1
        nodes, sols = 1, 0
        for c in range(n):
            b = 1 << c
            ok = not (cols & b) and not ((d1 >> (row + c)) & 1) and not ((d2 >> (row - c + n)) & 1)
            if ok:
                x, y = go(row + 1, cols | b, d1 | (1 << (row + c)), d2 | (1 << (row - c + n)))
                nodes, sols = nodes + x, sols + y
        return nodes, sols

    return go(0, 0, 0, 0)


def test_nqueens_search_space_matches_backtracking():
    for n in (6, 8):
        nodes, sols = brute_nodes(n)
        sp = nqueens.valid_space(n)
        exact = _bnb.knuth_sizes(sp, sp.root(), np.random.default_rng(0), frontier=10**9)
        # every valid placement below the last row checks n candidates, solutions cost 1
        assert exact[0] == (nodes - sols) * n + sols
        probed = _bnb.knuth_sizes(sp, sp.root(), np.random.default_rng(0), frontier=8)
        assert probed[0] == pytest.approx(exact[0], rel=0.15)
    assert brute_nodes(8)[1] == 92


def test_nqueens_fans_out_per_row_with_pruning():
    dag = dag_of("nqueens", "test")
    n = nqueens.CLASSES["test"]["n"]
    r = role(dag)
    for v in np.flatnonzero(r == "spawn").tolist():
        assert len(succ(dag, v)) == n + 1  # one task per column + the join
    depth = depth_from_roots(dag)
    valid = (r == "spawn") | (r == "leaf")
    assert valid[depth == 1].sum() == n  # the first queen never conflicts
    assert valid[depth == 2].sum() == (n - 1) * (n - 2)  # two rows: n^2 - n - 2(n-1)
    assert (r[depth == 2] == "pruned").sum() == n * n - (n - 1) * (n - 2)
    assert (r == "pruned").sum() > 0
    for v in np.flatnonzero(r == "pruned").tolist():
        assert [role(dag)[s] for s in succ(dag, v)] == ["join"]


# ---------------------------------------------------------------------------- knapsack


def brute_bnb_calls(v, w, cap, best) -> int:
    n = len(v)

    def go(i: int, c: int, val: int) -> int:
        if c < 0 or i == n or c == 0:
            return 1
        if val + c * v[i] // w[i] < best:
            return 1
        return 1 + go(i + 1, c, val) + go(i + 1, c - w[i], val + v[i])

    return go(0, cap, 0)


@settings(max_examples=15, deadline=None)
@given(items=st.integers(3, 14), k=st.integers(0, 50))
def test_knapsack_space_counts_the_branch_and_bound_calls(items, k):
    v, w, cap = knapsack.instance(items, k)
    best = knapsack.optimum(v, w, cap)
    assert best == max(
        sum(int(v[i]) for i in range(items) if m >> i & 1)
        for m in range(1 << items)
        if sum(int(w[i]) for i in range(items) if m >> i & 1) <= cap
    )
    sp = knapsack.space(v, w, cap, best)
    exact = _bnb.knuth_sizes(sp, sp.root(), np.random.default_rng(0), frontier=10**9)
    assert exact[0] == brute_bnb_calls(v.tolist(), w.tolist(), cap, best)


def test_knapsack_is_a_binary_take_skip_tree():
    dag = dag_of("knapsack")
    r = role(dag)
    spawns = np.flatnonzero(r == "spawn")
    assert spawns.size > 100
    for v in spawns.tolist():
        kids = [s for s in succ(dag, v) if r[s] != "join"]
        assert len(kids) == 2
        join_of(dag, v)
    depth = depth_from_roots(dag)
    for d in range(1, int(depth.max()) + 1):
        assert (depth == d).sum() <= 2**d
    assert (r == "leaf").sum() > 0  # serial search below the cutoff
    whole = role(dag_of("knapsack", "test"))  # 16 items: the whole search is tasks
    assert (whole == "pruned").sum() > (whole == "spawn").sum() / 2


# ---------------------------------------------------------------------------- uts


@pytest.mark.parametrize("seed", [0, 1])
def test_uts_is_a_binomial_tree(seed):
    dag = dag_of("uts", "small", seed)
    p = dags.uts.CLASSES["small"]
    r = role(dag)
    for v in np.flatnonzero(r == "spawn").tolist():
        kids = [s for s in succ(dag, v) if r[s] != "join"]
        assert len(kids) == (p["b0"] // 2 if v == 0 else p["m"])
        assert set(preds(dag)[join_of(dag, v)]) >= {v}
    nodes = (r == "spawn").sum() + (r == "leaf").sum()
    assert nodes == dag.meta["model"]["model_nodes"]
    mean = 1 + (p["b0"] // 2) / (1 - dags.uts.RHO)
    assert 0.5 * mean < nodes < 1.5 * mean
    # the class's real node count is spread over the model nodes
    assert dag.meta["model"]["uts_nodes_per_model_node"] * nodes == pytest.approx(p["nodes"])


# ---------------------------------------------------------------------------- floorplan


def test_floorplan_branch_and_bound_fans_out_by_candidates():
    dag = dag_of("floorplan")
    k = [0, *dag.meta["model"]["candidates"]]
    r = role(dag)
    depth = depth_from_roots(dag)
    spawns = np.flatnonzero(r == "spawn")
    for v in spawns.tolist():
        kids = [s for s in succ(dag, v) if r[s] != "join"]
        assert len(kids) == k[depth[v] + 1]
        join_of(dag, v)
    assert (r == "pruned").sum() > (r == "spawn").sum()  # most candidates are cut
    assert (r == "leaf").sum() > 100


# ---------------------------------------------------------------------------- strassen


@pytest.mark.parametrize("cls", dags.CLASSES["strassen"])
def test_strassen_fans_out_seven_ways(cls):
    dag = dag_of("strassen", cls)
    r = role(dag)
    spawns = np.flatnonzero(r == "spawn")
    for v in spawns.tolist():
        j = join_of(dag, v)
        kids = [s for s in succ(dag, v) if s != j]
        assert len(kids) == 7
        assert len(preds(dag)[j]) == 8
        assert dag.mem_s[v] / dag.task_time(dags.F_REF_HZ)[v] > 0.5  # additions stream memory
    levels = dag.meta["model"]["task_levels"]
    assert (r == "leaf").sum() == 7**levels
    assert spawns.size == sum(7**i for i in range(levels))


# ---------------------------------------------------------------------------- sort


def test_sort_splits_four_ways_then_merges():
    dag = dag_of("sort")
    r = role(dag)
    p = preds(dag)
    spawns = np.flatnonzero(r == "spawn")
    assert spawns.size > 10
    for v in spawns.tolist():
        j1 = join_of(dag, v)
        quarters = [s for s in succ(dag, v) if s != j1]
        assert len(quarters) == 4 and len(p[j1]) == 5
        after = succ(dag, j1)
        merges = [s for s in after if r[s] in ("merge_split", "merge_leaf")]
        j2 = [s for s in after if r[s] == "join"]
        assert len(merges) == 2 and len(j2) == 1  # two half merges, then the taskwait
        final = succ(dag, j2[0])
        assert len(final) == 1 and r[final[0]] in ("merge_split", "merge_leaf")
    for v in np.flatnonzero(r == "merge_split").tolist():
        s = succ(dag, v)
        assert len(s) == 3 and r[s[-1]] == "merge_join"  # two merge halves + taskwait
    quick = r == "quick_leaf"
    assert quick.sum() >= 4**3


# ---------------------------------------------------------------------------- fft


def test_fft_recursive_stages():
    dag = dag_of("fft")
    r = role(dag)
    radix = dag.meta["model"]["radix"]
    spawns = np.flatnonzero(r == "spawn")
    assert spawns.size >= 1 + radix
    for v in spawns.tolist():
        u = join_of(dag, v)  # end of the unshuffle stage
        sub = [s for s in succ(dag, u) if r[s] != "join"]
        kids_join = [s for s in succ(dag, u) if r[s] == "join"]
        assert len(sub) == radix and len(kids_join) == 1
        tw = [s for s in succ(dag, kids_join[0]) if r[s] != "join"]
        assert len(tw) == 1 and r[tw[0]] in ("split", "twiddle")
    for v in np.flatnonzero(r == "split").tolist():
        assert len(succ(dag, v)) == 2
    # the twiddle table is finished before the first FFT stage starts
    first = int(spawns.min())
    w_join = preds(dag)[first]
    assert len(w_join) == 1 and set(r[preds(dag)[w_join[0]]]) == {"w_coeff"}


# ---------------------------------------------------------------------------- sparselu


def bots_like_pattern(nb: int) -> list[list[bool]]:
    """The sparsity rule written out with loops, independently of the model's numpy version."""
    out = []
    for i in range(nb):
        row = []
        for j in range(nb):
            absent = False
            if i < j and i % 3 != 0:
                absent = True
            if i > j and j % 3 != 0:
                absent = True
            if i % 2 == 1 or j % 2 == 1:
                absent = True
            if i == j or i == j - 1 or i - 1 == j:
                absent = False
            row.append(not absent)
        out.append(row)
    return out


def bmods_per_step(nb: int) -> list[int]:
    m = bots_like_pattern(nb)
    counts = []
    for kk in range(nb):
        rows = [i for i in range(kk + 1, nb) if m[i][kk]]
        cols = [j for j in range(kk + 1, nb) if m[kk][j]]
        counts.append(len(rows) * len(cols))
        for i in rows:
            for j in cols:
                m[i][j] = True
    return counts


@settings(max_examples=20, deadline=None)
@given(nb=st.integers(1, 40))
def test_sparselu_fill_in_follows_the_pattern(nb):
    assert [len(r) * len(c) for r, c in sparselu.phases(nb)] == bmods_per_step(nb)
    assert sparselu.initial_pattern(nb).tolist() == bots_like_pattern(nb)


@pytest.mark.parametrize("variant", ["single", "for"])
def test_sparselu_is_a_phase_barriered_wavefront(variant):
    dag = dag_of("sparselu", "small", 0, variant)
    nb = sparselu.CLASSES["small"]["blocks"]
    r = role(dag)
    lu0 = np.flatnonzero(r == "lu0")
    assert lu0.size == nb
    phase = np.searchsorted(lu0, np.arange(dag.n), side="right") - 1  # tasks are made in order
    bmods = [int(((r == "bmod") & (phase == k)).sum()) for k in range(nb)]
    assert bmods == bmods_per_step(nb)
    p = preds(dag)
    for v in range(dag.n):
        for u in p[v]:
            assert phase[u] == phase[v] or (phase[u] + 1 == phase[v] and r[v] == "lu0")
        if r[v] in ("fwd", "bdiv"):
            assert p[v] == [int(lu0[phase[v]])]
    for k in range(1, nb):
        (barrier,) = p[lu0[k]]
        assert r[barrier] == "barrier"
        # the closing barrier waits for every bmod of its phase
        assert sum(r[u] == "bmod" for u in p[barrier]) == bmods[k - 1]


def test_sparselu_large_lumps_bmods_by_row():
    dag = dag_of("sparselu", "large")
    assert dag.meta["model"]["bmod_lumped_by_row"]
    assert dag.n <= dags.MAX_TASKS


# ---------------------------------------------------------------------------- alignment


@pytest.mark.parametrize("variant", ["single", "for"])
@pytest.mark.parametrize("cls", dags.CLASSES["alignment"])
def test_alignment_is_a_flat_bag_of_pairs(cls, variant):
    dag = dag_of("alignment", cls, 0, variant)
    n = dags.alignment.CLASSES[cls]["sequences"]
    r = role(dag)
    pairs = np.flatnonzero(r == "pair")
    assert pairs.size == n * (n - 1) // 2
    p = preds(dag)
    for v in pairs.tolist():
        assert [r[s] for s in succ(dag, v)] == ["sink"]
        assert all(r[u] in ("root", "gen") for u in p[v])
    (sink,) = np.flatnonzero(r == "sink")
    assert len(p[sink]) == pairs.size


# ---------------------------------------------------------------------------- health


def test_health_walks_the_village_tree_step_after_step():
    dag = dag_of("health")
    p = dags.health.CLASSES["small"]
    info = dag.meta["model"]
    r = role(dag)
    pre = np.flatnonzero(r == "pre")
    for v in pre.tolist():
        kids = [s for s in succ(dag, v) if r[s] != "post"]
        assert len(kids) == p["cities"]
    assert dag.n == info["walks"] * info["tasks_per_walk"]
    roots = [0] + [v for v in pre.tolist() if v and r[preds(dag)[v][0]] == "post"]
    assert len(roots) == info["walks"]  # walk k+1 starts from walk k's root post
    assert info["walks"] * info["steps_per_walk"] >= p["steps"]
    # the work is one population walk per village and step
    total = dag.task_time(dags.F_REF_HZ).sum() - dag.n * dags._graph.TASK_OVERHEAD_S
    patients = 2**4 * 10 + 18 * 2**3 * 10 + 18**2 * 2**2 * 10 + 18**3 * 2 * 10
    expected = patients * p["steps"] * dags.health.PATIENT_S * (1 + dags.health.PRE_FRACTION)
    assert total == pytest.approx(expected * calibration.SCALE["health"], rel=0.02)


# ---------------------------------------------------------------------------- concom


def test_concom_components_run_one_after_another():
    dag = dag_of("concom", "test", 3)
    info = dag.meta["model"]
    r = role(dag)
    assert (r == "driver").sum() == info["components"] + 1
    # one visit per node, one task per neighbour of every visited node
    assert (r == "visit").sum() == info["model_nodes"]
    assert (r == "visit").sum() + (r == "seen").sum() == 2 * info["edges"] + info["components"]
    drivers = np.flatnonzero(r == "driver")
    # each component's driver step depends (through the taskwait) on the previous component
    order = dag.topo_order()
    pos = np.empty(dag.n, int)
    pos[order] = np.arange(dag.n)
    assert np.all(np.diff(pos[drivers]) > 0)
    p = preds(dag)
    for d in drivers[1:].tolist():
        assert len(p[d]) == 1 and r[p[d][0]] in ("visit", "join")
