"""The event-driven cluster simulator: nodes, speed hook, validation and metrics."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from platforms.cluster.alibaba import parse_batch_task
from platforms.cluster.simcluster import (
    MAX_NODE_CPUS,
    MAX_NODES,
    SPEED_RANGE,
    ClusterView,
    NodeSpec,
    PiecewiseSpeed,
    PlacementError,
    SimError,
    Workload,
    board_node,
    capacity,
    makespan_lower_bound,
    parse_nodes_spec,
    simulate,
)
from platforms.cluster.synthetic import SyntheticConfig, synthetic_trace


class FirstFit:
    """A minimal placer for the simulator's own tests: ready order, first node that fits."""

    name = "first-fit"

    def reset(self, workload, nodes, seed):
        pass

    def place(self, view: ClusterView):
        free_c, free_m = view.free_cpu.copy(), view.free_mem.copy()
        out = []
        for t in view.ready.tolist():
            ok = np.flatnonzero((free_c >= view.cpu[t] - 1e-9) & (free_m >= view.mem[t] - 1e-9))
            if ok.size:
                k = int(ok[0])
                out.append((t, k))
                free_c[k] -= view.cpu[t]
                free_m[k] -= view.mem[t]
        return out


def _workload(rows):
    return Workload.from_jobs(parse_batch_task(rows).jobs)


def test_board_presets_and_nodes_spec():
    tx2 = board_node("tx2")
    assert tx2.cpus == 4  # the Denver pair is offline by default
    orin = board_node("orin-nx")
    assert orin.cpus == 8 and orin.mem == 16 and orin.speed > tx2.speed
    nodes = parse_nodes_spec("tx2:2,orin-nx:1:speed=1.5:cpus=6")
    assert [n.name for n in nodes] == ["tx2-0", "tx2-1", "orin-nx-0"]
    assert nodes[2].speed == 1.5 and nodes[2].cpus == 6
    assert capacity(nodes) == pytest.approx(2 * 4 * tx2.speed + 6 * 1.5)
    for bad in ("tx2:x", "tx2:2:volts=3", "tx2:0", ""):
        with pytest.raises(SimError):
            parse_nodes_spec(bad)


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("tx2:cpus=nan", "cpus='nan' must be a whole number of cores from 1 to 1024"),
        ("tx2:cpus=0", "cpus='0' must be a whole number of cores from 1 to 1024"),
        ("tx2:speed=inf", "speed='inf' must be a finite number from 0.01 to 100"),
        ("tx2:mem=-1", "mem='-1' must be finite and > 0"),
        ("tx2:mem=nan", "mem='nan' must be finite and > 0"),
    ],
)
def test_nodes_spec_values_must_be_finite_and_positive(bad, needle):
    with pytest.raises(SimError) as err:
        parse_nodes_spec(bad)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("tx2:2:3", "nodes spec 'tx2:2:3': count given twice"),
        ("tx2:1:1", "count given twice"),
        ("tx2:cpus=4:cpus=8", "nodes spec 'tx2:cpus=4:cpus=8': cpus given twice"),
        ("tx2:speed=1:2:speed=1", "speed given twice"),
        ("tx2:mem=4:mem=4", "mem given twice"),
    ],
)
def test_nodes_spec_refuses_a_field_given_twice(spec, needle):
    """The last of a repeated field used to win silently (tx2:2:3 made 3 nodes)."""
    with pytest.raises(SimError) as err:
        parse_nodes_spec(spec)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("tx2:speed=1e-300", "speed='1e-300' must be a finite number from 0.01 to 100"),
        ("tx2:speed=0.009", "from 0.01 to 100"),
        ("tx2:speed=100.5", "from 0.01 to 100"),
        ("tx2:cpus=0.001", "cpus='0.001' must be a whole number of cores from 1 to 1024"),
        ("tx2:cpus=2.5", "cpus='2.5' must be a whole number"),
        ("tx2:cpus=1025", "from 1 to 1024"),
    ],
)
def test_nodes_spec_refuses_absurd_speeds_and_cores(spec, needle):
    """speed=1e-300 printed 300-digit makespans; cpus=0.001 or 2.5 is no board's core count."""
    with pytest.raises(SimError) as err:
        parse_nodes_spec(spec)
    assert needle in str(err.value)


def test_nodes_spec_accepts_the_bounds_and_the_board_defaults():
    nodes = parse_nodes_spec(
        f"tx2:speed=0.01:cpus=1,orin-nx:speed=100:cpus={MAX_NODE_CPUS},rubikpi3:cpus=4.0:mem=0.5"
    )
    assert [(n.cpus, n.speed) for n in nodes[:2]] == [(1, 0.01), (MAX_NODE_CPUS, 100)]
    assert nodes[2].cpus == 4 and nodes[2].mem == 0.5
    lo, hi = SPEED_RANGE
    for board in ("tx2", "orin-nx", "rubikpi3"):  # every shipped board's own speed is inside
        node = board_node(board)
        assert lo <= node.speed <= hi and 1 <= node.cpus <= MAX_NODE_CPUS


def _python_lines(fn) -> int:
    """The lines of Python that ``fn()`` runs, its callees' included: a measure of its work
    that the machine's speed and load do not change."""
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(before)
    return lines


def test_nodes_spec_numbers_per_board_in_linear_time():
    nodes = parse_nodes_spec("tx2:2,orin-nx:1,tx2:1")
    assert [n.name for n in nodes] == ["tx2-0", "tx2-1", "orin-nx-0", "tx2-2"]
    many = parse_nodes_spec("tx2:10000")
    assert len({n.name for n in many}) == 10000
    # the spec is loaded now: twice the nodes, twice the work (a scan per node, O(n^2), made
    # it four times, and seconds at 10000 nodes)
    one, two = (_python_lines(lambda n=n: parse_nodes_spec(f"tx2:{n}")) for n in (1000, 2000))
    assert two < 2.5 * one, (one, two)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("tx2:2000000", "'tx2:2000000': more than 10000 nodes"),
        ("tx2:1000000000", "more than 10000 nodes"),
        ("tx2:6000,orin-nx:4001", "'orin-nx:4001': more than 10000 nodes in total (6000 before"),
    ],
)
def test_nodes_spec_refuses_more_than_max_nodes_before_building_them(spec, needle, monkeypatch):
    assert len(parse_nodes_spec(f"tx2:{MAX_NODES - 1},orin-nx:1")) == MAX_NODES
    built, init = 0, NodeSpec.__init__

    def counted_init(self, *args, **kwargs):
        nonlocal built
        built += 1  # building them first: 2e6 took 19 s and 1.2 GB, 1e9 a MemoryError
        assert built <= MAX_NODES, f"{spec!r}: a node past the bound was built"
        init(self, *args, **kwargs)

    monkeypatch.setattr(NodeSpec, "__init__", counted_init)
    with pytest.raises(SimError) as err:
        parse_nodes_spec(spec)
    assert needle in str(err.value)


def test_chain_runs_at_node_speed_and_metrics():
    w = _workload(["M1,1,j,1,Terminated,0,10,100,0.1", "R2_1,1,j,1,Terminated,10,30,100,0.1"])
    node = NodeSpec("n", "x", cpus=1, mem=1, speed=2.0)
    res = simulate(w, [node], FirstFit())
    assert res.start.tolist() == [0.0, 5.0]
    assert res.finish.tolist() == [5.0, 15.0]
    assert res.makespan == 15.0
    assert res.mean_flow == pytest.approx(7.5)  # (5 + 10) / 2, flow from the ready time
    assert res.mean_wait == 0.0


def test_makespan_lower_bound_is_the_chain_or_the_work_whichever_binds():
    chain = _workload(["M1,1,j,1,Terminated,0,10,100,0.1", "R2_1,1,j,1,Terminated,10,30,100,0.1"])
    fast = NodeSpec("f", "x", cpus=1, mem=1, speed=2.0)
    slow = NodeSpec("s", "x", cpus=8, mem=8, speed=0.5)
    # the chain of 30 s at the fastest speed 2.0 binds (work bound 30 / 6 = 5 s)
    assert makespan_lower_bound(chain, [fast, slow]) == pytest.approx(15.0)
    assert simulate(chain, [fast], FirstFit()).makespan == pytest.approx(15.0)  # tight
    # four independent 10 s single-core tasks on one 2-core node: the work binds (40 / 2)
    par = _workload([f"task_{i},1,j,1,Terminated,0,10,100,0.1" for i in range(4)])
    two = NodeSpec("n", "x", cpus=2, mem=8, speed=1.0)
    assert makespan_lower_bound(par, [two]) == pytest.approx(20.0)
    assert simulate(par, [two], FirstFit()).makespan == pytest.approx(20.0)
    # work that arrives late counts from its arrival, measured from the first arrival
    late = _workload(
        ["task_1,1,a,1,Terminated,0,10,100,0.1", "task_1,1,b,1,Terminated,100,110,100,0.1"]
    )
    assert makespan_lower_bound(late, [two]) == pytest.approx(110.0)
    assert makespan_lower_bound(_workload([]), [two]) == 0.0


def test_waiting_for_capacity_counts_as_wait():
    w = _workload(["M1,1,j,1,Terminated,0,10,100,0.1", "M2,1,j,1,Terminated,0,10,100,0.1"])
    res = simulate(w, [NodeSpec("n", "x", cpus=1, mem=1, speed=1.0)], FirstFit())
    assert sorted(res.start.tolist()) == [0.0, 10.0]
    assert res.mean_wait == 5.0 and res.mean_flow == 15.0 and res.makespan == 20.0


def test_speed_hook_is_piecewise_exact():
    # half speed from t=4 to t=8: 10 s of work = 4 + 4*0.5 + 4 -> finishes at 12
    w = _workload(["M1,1,j,1,Terminated,0,10,100,0.1"])
    node = NodeSpec(
        "n",
        "x",
        cpus=1,
        mem=1,
        speed=1.0,
        speed_fn=PiecewiseSpeed((0.0, 4.0, 8.0), (1.0, 0.5, 1.0)),
    )
    res = simulate(w, [node], FirstFit())
    assert res.finish[0] == pytest.approx(12.0)


def test_speed_hook_sampled_callable():
    w = _workload(["M1,1,j,1,Terminated,0,10,100,0.1"])
    node = NodeSpec(
        "n",
        "x",
        cpus=1,
        mem=1,
        speed=1.0,
        speed_fn=lambda t: 0.5 if t >= 2.0 else 1.0,
        speed_period_s=1.0,
    )
    res = simulate(w, [node], FirstFit())
    assert res.finish[0] == pytest.approx(2.0 + 8.0 / 0.5)


def test_oversized_tasks_are_clamped_and_counted():
    w = _workload(["M1,1,j,1,Terminated,0,10,800,0.1"])  # 8 cores
    res = simulate(w, [NodeSpec("n", "x", cpus=4, mem=1, speed=1.0)], FirstFit())
    assert res.clamped == 1 and res.cpu[0] == 4


class Cheater(FirstFit):
    name = "cheater"

    def place(self, view):
        return [(int(t), 0) for t in view.ready]  # ignores capacity


class Idler(FirstFit):
    name = "idler"

    def place(self, view):
        return []


def test_invalid_placements_are_refused_with_the_cause():
    w = _workload(["M1,1,j,1,Terminated,0,10,100,0.1", "M2,1,j,1,Terminated,0,10,100,0.1"])
    with pytest.raises(PlacementError, match="does not fit node 'n'"):
        simulate(w, [NodeSpec("n", "x", cpus=1, mem=1, speed=1.0)], Cheater())
    with pytest.raises(PlacementError, match="idle cluster"):
        simulate(w, [NodeSpec("n", "x", cpus=1, mem=1, speed=1.0)], Idler())


def test_release_profile_and_earliest_start():
    w = _workload(
        [
            "M1,1,j,1,Terminated,0,10,100,0.1",
            "M2,1,j,1,Terminated,0,4,100,0.1",
            "M3,1,j,1,Terminated,0,1,200,0.1",
        ]
    )
    nodes = (
        NodeSpec("a", "x", cpus=2, mem=1, speed=1.0),
        NodeSpec("b", "x", cpus=2, mem=1, speed=1.0),
    )
    view = ClusterView(
        t=1.0,
        workload=w,
        nodes=nodes,
        ready=np.array([2]),
        ready_t=np.zeros(3),
        free_cpu=np.array([0.0, 1.0]),
        free_mem=np.array([0.8, 0.9]),
        speed=np.ones(2),
        run_node=np.array([0, 0, -1]),
        finish_est=np.array([10.0, 4.0, np.inf]),
        running=np.array([0, 1]),
    )
    times, cpu, _ = view.release_profile()
    assert times[0].tolist() == [4.0, 10.0]
    assert cpu[0].tolist() == [1.0, 2.0]
    assert np.isinf(times[1]).all()
    assert view.earliest_start(2.0, 0.1).tolist() == [10.0, np.inf]  # b never has 2 cores
    assert view.earliest_start(1.0, 0.1).tolist() == [4.0, 1.0]
    assert view.next_release().tolist() == [3.0, 0.0]


def test_ten_thousand_tasks_replay_reasonably_fast():
    cfg = SyntheticConfig(n_jobs=150, seed=2, load=0.9)
    w = Workload.from_jobs(synthetic_trace(cfg).jobs)
    res = simulate(w, parse_nodes_spec("orin-nx:4,tx2:4"), FirstFit())
    assert np.isfinite(res.finish).all() and (res.start >= res.ready_t - 1e-9).all()


def _one_task():
    return _workload(["M1,1,j,1,Terminated,0,4,100,0.1"])  # 4 s of work


@pytest.mark.timeout(30)
def test_a_speed_change_just_after_a_task_ends_is_handled_once():
    """A task ending within the event tolerance before a throttle (9.9999999995 s, throttle at
    10 s) had the simulator pop the throttle, find the same change time next, push it again
    and pop it again, for ever (a hypothesis example of the placement property test hung CI)."""
    w = _workload(
        ["M1,1,j,1,Terminated,0,9.9999999995,100,0.1", "M2,1,j,1,Terminated,0,20,100,0.1"]
    )
    node = NodeSpec("n", "x", 2, 1, 1.0, speed_fn=PiecewiseSpeed((0.0, 10.0), (1.0, 0.5)))
    res = simulate(w, [node], FirstFit())
    assert res.finish[0] == pytest.approx(10.0)
    assert res.finish[1] == pytest.approx(10.0 + 10.0 / 0.5)  # half speed from t=10


def test_piecewise_speed_is_one_before_its_first_time():
    # a throttle from t=100 must not slow a task that ends at t=4 (it applied from t=0)
    node = NodeSpec("n", "x", 1, 1, 1.0, speed_fn=PiecewiseSpeed((100.0,), (0.5,)))
    assert simulate(_one_task(), [node], FirstFit()).finish[0] == pytest.approx(4.0)
    later = NodeSpec("n", "x", 1, 1, 1.0, speed_fn=PiecewiseSpeed((2.0,), (0.5,)))
    assert simulate(_one_task(), [later], FirstFit()).finish[0] == pytest.approx(2.0 + 2.0 / 0.5)
    assert PiecewiseSpeed((), ())(5.0) == 1.0


@pytest.mark.parametrize(
    "times, factors, needle",
    [
        ((0.0, 10.0, 2.0), (1.0, 1.0, 0.5), "strictly increasing"),
        ((0.0, 0.0), (1.0, 0.5), "strictly increasing"),
        ((0.0,), (1.0, 0.5), "1 times but 2 factors"),
        ((float("nan"),), (1.0,), "times must be finite"),
        ((0.0,), (0.0,), "factors must be finite, > 0 and <= 1"),
        ((0.0,), (float("inf"),), "factors must be finite, > 0 and <= 1"),
        ((0.0,), (-1.0,), "factors must be finite, > 0 and <= 1"),
        ((0.0,), (2.0,), "factors must be finite, > 0 and <= 1"),  # beat the lower bound
    ],
)
def test_piecewise_speed_is_validated(times, factors, needle):
    with pytest.raises(SimError, match=needle):
        PiecewiseSpeed(times, factors)


@pytest.mark.parametrize("period", [0.0, -5.0, float("nan"), float("inf")])
def test_sampled_speed_fn_needs_a_finite_positive_period(period):
    node = NodeSpec("n", "x", 1, 1, 1.0, speed_fn=lambda t: 1.0, speed_period_s=period)
    t0 = time.monotonic()
    with pytest.raises(SimError, match="speed_period_s must be finite and > 0"):
        simulate(_one_task(), [node], FirstFit())  # 0 or less hung, NaN stopped sampling
    assert time.monotonic() - t0 < 5.0
    # a speed_fn with next_change does not sample: its period is not used
    exact = NodeSpec("n", "x", 1, 1, 1.0, speed_fn=PiecewiseSpeed((0.0,), (1.0,)))
    assert simulate(_one_task(), [exact], FirstFit()).finish[0] == pytest.approx(4.0)


@pytest.mark.parametrize("field", ["cpus", "mem", "speed"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_node_values_must_be_finite_and_positive(field, value):
    kw = {"name": "n", "board": "x", "cpus": 1.0, "mem": 1.0, "speed": 1.0, field: value}
    with pytest.raises(SimError, match="must be finite and > 0") as err:
        simulate(_one_task(), [NodeSpec(**kw)], FirstFit())
    assert "policy" not in str(err.value)  # a NaN speed used to blame the placer


@pytest.mark.parametrize("factor", [float("inf"), float("nan"), 0.0, -1.0, None])
def test_speed_fn_values_must_be_finite_and_positive(factor):
    node = NodeSpec("n", "x", 1, 1, 1.0, speed_fn=lambda t: factor, speed_period_s=1.0)
    with pytest.raises(SimError, match="expected a finite factor > 0"):
        simulate(_one_task(), [node], FirstFit())
