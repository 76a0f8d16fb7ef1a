"""Event-driven simulator of a heterogeneous cluster of boards running DAG jobs.

Nodes have cores, memory and a per-core speed (reference node = 1.0: a task of ``work``
seconds runs ``work / speed`` seconds). A node's speed may change with time through a hook,
``NodeSpec.speed_fn(t) -> factor`` (for instance the simulated board's f(t)/f_max under
thermal capping); running tasks then progress piecewise at the new rate.

Jobs arrive online at their trace arrival time. A task becomes *ready* when every parent has
finished. At every event time (arrival, completion, speed change) with ready tasks the
simulator asks its :class:`Placer` for ``(task, node)`` assignments that fit the node's free
cores and memory now; it validates every one, so a schedule can never break a dependency or a
capacity. A placer may hold tasks back (e.g. to wait for a faster node) while something runs.

Metrics (one definition everywhere, stated with each result):
- makespan = max_i C_i - min_j a_j (C completion, a job arrival);
- task flow time F_i = C_i - r_i and wait time W_i = S_i - r_i, with r_i the time task i
  became ready (its job's arrival for a root task) and S_i its start; both averaged over tasks;
- makespan lower bound (:func:`makespan_lower_bound`): what no placement can beat, so a ratio
  to it says how much any policy could still gain.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from platforms.cluster.alibaba import TraceJob
from platforms.errors import HidvfsError
from platforms.spec import load_board

#: per-MHz performance of each board's capacity-1.0 core relative to a Cortex-A57. The spec's
#: ``capacity`` is relative inside one board only, so crossing boards needs this factor.
#: Simulation defaults, not measurements (verify with a benchmark; override per node).
BOARD_REF_PERF = {"tx2": 1.0, "orin-nx": 1.7, "rubikpi3": 0.6}
#: memory per board in GB (Orin NX p3767-0000 = 16 GB; TX2 and RUBIK Pi 3 8 GB, verify on board)
BOARD_MEM_GB = {"tx2": 8.0, "orin-nx": 16.0, "rubikpi3": 8.0}
#: the reference core runs at 2 GHz with capacity 1.0 and perf 1.0
REF_CORE_KHZ = 2_000_000
#: trace memory is normalised (0-100); the simulator reads one unit as this many GB
GB_PER_MEM_UNIT = 1.0
#: most nodes a nodes spec may name in total (twice Kubernetes' 5000-node limit)
MAX_NODES = 10_000
#: most cores a nodes spec may give one node (``cpus=``): the shipped boards have 4-8, a large
#: server a few hundred; beyond that a node is a typo, not a board
MAX_NODE_CPUS = 1024
#: per-core ``speed=`` bounds (reference core 1.0; the shipped boards give 1.0-1.7): outside
#: them a typo, not a board (speed=1e-300 printed 300-digit makespans)
SPEED_RANGE = (0.01, 100.0)
_EPS = 1e-9


class SimError(HidvfsError):
    """A cluster or workload the simulator cannot run (names the node, task or key)."""


class PlacementError(SimError):
    """A placer returned an assignment that breaks a dependency or a capacity."""


def _finite(x) -> bool:
    """A real, finite number (not a bool, a string or None)."""
    try:
        return not isinstance(x, bool) and math.isfinite(x)
    except TypeError:
        return False


def _positive(x) -> bool:
    """A real, finite number > 0 (NaN and inf passed the old ``x > 0`` checks or hung)."""
    return _finite(x) and x > 0


@dataclass(frozen=True)
class NodeSpec:
    """One node. ``speed_fn(t)`` multiplies ``speed`` at time t (None: constant speed).

    If ``speed_fn`` has a ``next_change(t)`` method the simulator steps exactly at its change
    points; otherwise it samples the function every ``speed_period_s`` seconds.
    """

    name: str
    board: str
    cpus: float
    mem: float
    speed: float
    speed_fn: Callable[[float], float] | None = field(default=None, compare=False)
    speed_period_s: float = 5.0


@dataclass(frozen=True)
class PiecewiseSpeed:
    """A speed factor that is ``factors[k]`` (in (0, 1]: a throttle, never a boost past the
    nominal speed) from ``times[k]`` until ``times[k+1]``, and 1.0 before ``times[0]`` (a
    throttle from t=100 used to apply from t=0)."""

    times: tuple[float, ...]
    factors: tuple[float, ...]

    def __post_init__(self) -> None:
        times, factors = tuple(self.times), tuple(self.factors)
        if len(times) != len(factors):
            raise SimError(
                f"PiecewiseSpeed: {len(times)} times but {len(factors)} factors; expected one each"
            )
        if not all(_finite(x) for x in times):
            raise SimError(f"PiecewiseSpeed: times must be finite numbers, got {times}")
        if any(b <= a for a, b in zip(times, times[1:])):
            raise SimError(f"PiecewiseSpeed: times must be strictly increasing, got {times}")
        if not all(_positive(x) and x <= 1.0 for x in factors):
            # a factor is the current over the nominal speed: above 1 the node would run
            # faster than its spec, below what makespan_lower_bound takes as its best
            raise SimError(f"PiecewiseSpeed: factors must be finite, > 0 and <= 1, got {factors}")

    def __call__(self, t: float) -> float:
        k = int(np.searchsorted(self.times, t, side="right")) - 1
        return self.factors[k] if k >= 0 else 1.0

    def next_change(self, t: float) -> float:
        k = int(np.searchsorted(self.times, t, side="right"))
        return self.times[k] if k < len(self.times) else float("inf")


def board_node(
    board: str,
    name: str | None = None,
    *,
    cpus: float | None = None,
    mem: float | None = None,
    speed: float | None = None,
    speed_fn: Callable[[float], float] | None = None,
) -> NodeSpec:
    """A node of a shipped board type, sized from its spec (cores online by default)."""
    spec = load_board(board)
    cores = [
        (c.capacity, c.fmax_khz)
        for c in spec.clusters
        for cpu in c.cpus
        if cpu not in c.offline_by_default
    ]
    per_core = (
        float(np.mean([cap * f for cap, f in cores]))
        / REF_CORE_KHZ
        * BOARD_REF_PERF.get(board, 1.0)
    )
    return NodeSpec(
        name=name or board,
        board=board,
        cpus=float(len(cores) if cpus is None else cpus),
        mem=float(BOARD_MEM_GB.get(board, 4.0) / GB_PER_MEM_UNIT if mem is None else mem),
        speed=float(per_core if speed is None else speed),
        speed_fn=speed_fn,
    )


def parse_nodes_spec(text: str) -> list[NodeSpec]:
    """``"tx2:4,orin-nx:2,rubikpi3:2:speed=1.1"`` -> nodes ``tx2-0..3, orin-nx-0..1, ...``.

    Each item is ``board[:count][:key=value...]``, each field at most once (a repeat used to
    win silently): ``count`` a whole number >= 1, ``cpus`` whole cores in 1..:data:`MAX_NODE_CPUS`,
    ``mem`` finite and > 0 (normalised units), ``speed`` per-core in :data:`SPEED_RANGE`
    (reference 1.0); at most :data:`MAX_NODES` nodes in total.
    """
    nodes: list[NodeSpec] = []
    seen: Counter[str] = Counter()
    lo, hi = SPEED_RANGE
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        board, count, kw = parts[0], None, {}
        for p in parts[1:]:
            if "=" in p:
                k, v = p.split("=", 1)
                if k not in ("cpus", "mem", "speed"):
                    raise SimError(f"nodes spec {item!r}: unknown key {k!r} (cpus, mem, speed)")
                if k in kw:
                    raise SimError(f"nodes spec {item!r}: {k} given twice")
                try:
                    x = kw[k] = float(v)
                except ValueError:
                    raise SimError(f"nodes spec {item!r}: {k}={v!r} is not a number") from None
                # nan fails every comparison, so each check below refuses it too
                if k == "cpus" and not (1 <= x <= MAX_NODE_CPUS and x.is_integer()):
                    raise SimError(
                        f"nodes spec {item!r}: cpus={v!r} must be a whole number of cores "
                        f"from 1 to {MAX_NODE_CPUS}"
                    )
                if k == "speed" and not lo <= x <= hi:
                    raise SimError(
                        f"nodes spec {item!r}: speed={v!r} must be a finite number from "
                        f"{lo:g} to {hi:g} (per-core, reference core 1.0)"
                    )
                if k == "mem" and not (math.isfinite(x) and x > 0):
                    raise SimError(f"nodes spec {item!r}: mem={v!r} must be finite and > 0")
            else:
                if count is not None:
                    raise SimError(f"nodes spec {item!r}: count given twice")
                try:
                    count = int(p)
                except ValueError:
                    raise SimError(f"nodes spec {item!r}: count {p!r} is not an integer") from None
        count = 1 if count is None else count
        if count < 1:
            raise SimError(f"nodes spec {item!r}: count must be >= 1")
        if len(nodes) + count > MAX_NODES:  # before building them: 2e6 nodes took 1.2 GB
            raise SimError(
                f"nodes spec {item!r}: more than {MAX_NODES} nodes in total "
                f"({len(nodes)} before it, {count} in it)"
            )
        base = board_node(board, board, **kw)  # one spec read per item, not per node
        for _ in range(count):  # per-board numbering (a Counter: a scan per node was O(n^2))
            nodes.append(replace(base, name=f"{board}-{seen[board]}"))
            seen[board] += 1
    if not nodes:
        raise SimError(f"nodes spec {text!r} names no node")
    return nodes


def capacity(nodes: Sequence[NodeSpec]) -> float:
    """Sum of cores x nominal speed: core-seconds of reference work per second."""
    return float(sum(n.cpus * n.speed for n in nodes))


# --------------------------------------------------------------------------------------------
# Workload: every task of every job in flat arrays


@dataclass(frozen=True, eq=False)
class Workload:
    job_names: tuple[str, ...]
    job_arrival: np.ndarray  # [J]
    job_ptr: np.ndarray  # [J+1]; tasks of job j are job_ptr[j]:job_ptr[j+1]
    task_names: tuple[str, ...]
    task_job: np.ndarray  # [T]
    work: np.ndarray  # [T] seconds on a speed-1 core
    cpu: np.ndarray  # [T] cores
    mem: np.ndarray  # [T] normalised units
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    rank_u: np.ndarray  # [T] work of the longest path from the task to an exit (incl. itself)

    @property
    def n_tasks(self) -> int:
        return int(self.work.shape[0])

    @property
    def n_jobs(self) -> int:
        return int(self.job_arrival.shape[0])

    @property
    def npred(self) -> np.ndarray:
        return np.diff(self.pred_ptr)

    def successors(self, i: int) -> np.ndarray:
        return self.succ_idx[self.succ_ptr[i] : self.succ_ptr[i + 1]]

    def predecessors(self, i: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[i] : self.pred_ptr[i + 1]]

    @classmethod
    def from_jobs(cls, jobs: Sequence[TraceJob]) -> Workload:
        jobs = sorted(jobs, key=lambda j: j.arrival)
        sizes = np.array([j.dag.n for j in jobs], dtype=np.int64)
        job_ptr = np.zeros(len(jobs) + 1, dtype=np.int64)
        np.cumsum(sizes, out=job_ptr[1:])
        src, dst = [], []
        for k, j in enumerate(jobs):
            d = j.dag
            off = job_ptr[k]
            src.append(np.repeat(np.arange(d.n), np.diff(d.succ_ptr)) + off)
            dst.append(d.succ_idx + off)
        src_a = np.concatenate(src) if src else np.zeros(0, np.int64)
        dst_a = np.concatenate(dst) if dst else np.zeros(0, np.int64)
        t_n = int(job_ptr[-1])
        work = np.concatenate([j.work_s for j in jobs]) if jobs else np.zeros(0)
        succ_ptr, succ_idx = _csr(src_a, dst_a, t_n)
        pred_ptr, pred_idx = _csr(dst_a, src_a, t_n)
        return cls(
            job_names=tuple(j.name for j in jobs),
            job_arrival=np.array([j.arrival for j in jobs], dtype=float),
            job_ptr=job_ptr,
            task_names=tuple(t.name for j in jobs for t in j.tasks),
            task_job=np.repeat(np.arange(len(jobs)), sizes),
            work=work.astype(float),
            cpu=np.concatenate([j.cpu for j in jobs]).astype(float) if jobs else np.zeros(0),
            mem=np.concatenate([j.mem for j in jobs]).astype(float) if jobs else np.zeros(0),
            succ_ptr=succ_ptr,
            succ_idx=succ_idx,
            pred_ptr=pred_ptr,
            pred_idx=pred_idx,
            rank_u=_rank_u(work, succ_ptr, succ_idx, pred_ptr, pred_idx),
        )


def single_task_workload(
    name: str,
    work_s: float,
    cpu: float,
    mem: float,
    rank_s: float | None = None,
    arrival: float = 0.0,
) -> Workload:
    """A one-task workload (a pod to place live): ``rank_s`` is the critical path left from
    this task, itself included (defaults to its own work)."""
    one = np.zeros(1, dtype=np.int64)
    return Workload(
        job_names=(name,),
        job_arrival=np.array([arrival], dtype=float),
        job_ptr=np.array([0, 1], dtype=np.int64),
        task_names=(name,),
        task_job=one.copy(),
        work=np.array([work_s], dtype=float),
        cpu=np.array([cpu], dtype=float),
        mem=np.array([mem], dtype=float),
        succ_ptr=np.zeros(2, dtype=np.int64),
        succ_idx=np.zeros(0, dtype=np.int64),
        pred_ptr=np.zeros(2, dtype=np.int64),
        pred_idx=np.zeros(0, dtype=np.int64),
        rank_u=np.array([max(work_s, rank_s if rank_s is not None else work_s)], dtype=float),
    )


def _csr(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(src, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    return ptr, dst[order].astype(np.int64)


def topo_order(succ_ptr, succ_idx, pred_ptr) -> np.ndarray:
    """Kahn order of a CSR graph (the reader has already rejected cycles)."""
    indeg = np.diff(pred_ptr).copy()
    stack = np.flatnonzero(indeg == 0).tolist()
    order = []
    while stack:
        v = stack.pop()
        order.append(v)
        for s in succ_idx[succ_ptr[v] : succ_ptr[v + 1]].tolist():
            indeg[s] -= 1
            if indeg[s] == 0:
                stack.append(s)
    if len(order) != indeg.shape[0]:
        raise SimError(
            f"workload has a dependency cycle ({indeg.shape[0] - len(order)} tasks unreachable)"
        )
    return np.array(order, dtype=np.int64)


def _rank_u(work, succ_ptr, succ_idx, pred_ptr, pred_idx) -> np.ndarray:
    rank = work.astype(float).copy()
    for v in topo_order(succ_ptr, succ_idx, pred_ptr)[::-1].tolist():
        s = succ_idx[succ_ptr[v] : succ_ptr[v + 1]]
        if s.size:
            rank[v] = work[v] + rank[s].max()
    return rank


# --------------------------------------------------------------------------------------------
# What a placer sees


class ClusterView:
    """The cluster at one decision point. Valid only during the ``place`` call; read-only.

    The simulator builds it with :meth:`from_sim`; the live extender builds one from node
    telemetry (no running tasks known, so no release profile beyond "free now").
    """

    def __init__(
        self,
        *,
        t: float,
        workload: Workload,
        nodes: tuple[NodeSpec, ...],
        ready: np.ndarray,
        ready_t: np.ndarray,
        free_cpu: np.ndarray,
        free_mem: np.ndarray,
        speed: np.ndarray,
        cap_cpu: np.ndarray | None = None,
        cap_mem: np.ndarray | None = None,
        cpu: np.ndarray | None = None,
        mem: np.ndarray | None = None,
        run_node: np.ndarray | None = None,
        finish_est: np.ndarray | None = None,
        running: np.ndarray | None = None,
        job_unstarted_work: np.ndarray | None = None,
        job_left_tasks: np.ndarray | None = None,
        flow_area: float = 0.0,
    ):
        t_n = workload.n_tasks
        self.t = float(t)
        self.workload = workload
        self.nodes = tuple(nodes)
        self.ready = np.asarray(ready, dtype=np.int64)
        self.ready_t = ready_t
        self.free_cpu = np.asarray(free_cpu, dtype=float)
        self.free_mem = np.asarray(free_mem, dtype=float)
        self.cap_cpu = (
            np.array([n.cpus for n in nodes], dtype=float) if cap_cpu is None else cap_cpu
        )
        self.cap_mem = np.array([n.mem for n in nodes], dtype=float) if cap_mem is None else cap_mem
        self.speed = np.asarray(speed, dtype=float)
        self.cpu = workload.cpu if cpu is None else cpu  # demands after clamping
        self.mem = workload.mem if mem is None else mem
        self.run_node = np.full(t_n, -1, dtype=np.int64) if run_node is None else run_node
        self.finish_est = np.full(t_n, np.inf) if finish_est is None else finish_est
        self.running = np.zeros(0, dtype=np.int64) if running is None else running
        if job_unstarted_work is None:
            job_unstarted_work = (
                np.add.reduceat(workload.work, workload.job_ptr[:-1])
                if t_n
                else np.zeros(workload.n_jobs)
            )
        self.job_unstarted_work = job_unstarted_work
        self.job_left_tasks = (
            np.diff(workload.job_ptr) if job_left_tasks is None else job_left_tasks
        )
        self.n_in_system = int(self.ready.size + self.running.size)
        self.flow_area = float(flow_area)
        self._profile: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_sim(cls, sim: ClusterSim) -> ClusterView:
        return cls(
            t=sim.t,
            workload=sim.w,
            nodes=sim.nodes,
            ready=np.fromiter(sim.ready.keys(), dtype=np.int64, count=len(sim.ready)),
            ready_t=sim.ready_t,
            free_cpu=sim.free_cpu.copy(),
            free_mem=sim.free_mem.copy(),
            speed=sim.speed.copy(),
            cap_cpu=sim.cap_cpu,
            cap_mem=sim.cap_mem,
            cpu=sim.cpu,
            mem=sim.mem,
            run_node=sim.run_node,
            finish_est=sim.finish_est,
            running=np.fromiter(sim.running, dtype=np.int64, count=len(sim.running)),
            job_unstarted_work=sim.job_unstarted_work,
            job_left_tasks=sim.job_left_tasks,
            flow_area=sim.flow_area,
        )

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def release_profile(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per node, the expected release times of running tasks, sorted, with the free cores
        and memory after each release: three ``[N, K]`` arrays (times padded with inf)."""
        if self._profile is None:
            n = self.n_nodes
            r = self.running
            if r.size == 0:
                k = 1
                times = np.full((n, k), np.inf)
                cpu = np.repeat(self.free_cpu[:, None], k, axis=1)
                mem = np.repeat(self.free_mem[:, None], k, axis=1)
            else:
                rn = self.run_node[r]
                fe = self.finish_est[r]
                order = np.lexsort((fe, rn))
                r, rn, fe = r[order], rn[order], fe[order]
                counts = np.bincount(rn, minlength=n)
                first = np.concatenate([[0], np.cumsum(counts)[:-1]])
                pos = np.arange(r.size) - first[rn]
                k = int(counts.max())
                times = np.full((n, k), np.inf)
                dc = np.zeros((n, k))
                dm = np.zeros((n, k))
                times[rn, pos] = fe
                dc[rn, pos] = self.cpu[r]
                dm[rn, pos] = self.mem[r]
                cpu = self.free_cpu[:, None] + np.cumsum(dc, axis=1)
                mem = self.free_mem[:, None] + np.cumsum(dm, axis=1)
            self._profile = (times, cpu, mem)
        return self._profile

    def next_release(self) -> np.ndarray:
        """``[N]`` seconds until each node's next expected release (0 when nothing runs)."""
        times = self.release_profile()[0][:, 0]
        return np.where(np.isfinite(times), times - self.t, 0.0)

    def earliest_start(
        self,
        cpu: float,
        mem: float,
        free_cpu: np.ndarray | None = None,
        free_mem: np.ndarray | None = None,
        commits: Sequence[tuple[int, float, float, float]] = (),
    ) -> np.ndarray:
        """``[N]`` earliest time each node has ``cpu`` cores and ``mem`` free (inf: never),
        assuming running tasks finish at their expected times. ``free_cpu``/``free_mem``:
        the free capacity after the placements a policy already made in this round; without
        ``commits`` those keep their share for good, with them (node, expected finish, cpu,
        mem of each such placement) they give it back when they finish."""
        fc = self.free_cpu if free_cpu is None else free_cpu
        fm = self.free_mem if free_mem is None else free_mem
        fits_now = (fc >= cpu - _EPS) & (fm >= mem - _EPS)
        times, pc, pm = self.release_profile()
        ok = (pc - (self.free_cpu - fc)[:, None] >= cpu - _EPS) & (
            pm - (self.free_mem - fm)[:, None] >= mem - _EPS
        )
        idx = np.argmax(ok, axis=1)
        later = np.where(ok.any(axis=1), times[np.arange(self.n_nodes), idx], np.inf)
        est = np.where(fits_now, self.t, np.maximum(later, self.t))
        for k in {c[0] for c in commits} if commits else ():
            if not fits_now[k]:
                est[k] = self._start_with(k, cpu, mem, fc[k], fm[k], commits)
        return est

    def _start_with(self, k, cpu, mem, fc, fm, commits) -> float:
        """Node ``k``'s earliest start for (cpu, mem) with this round's placements on it
        released at their finish (a few per round: a plain merge)."""
        times, pc, pm = self.release_profile()
        events = [
            (
                float(times[k, i]),
                float(pc[k, i] - (pc[k, i - 1] if i else self.free_cpu[k])),
                float(pm[k, i] - (pm[k, i - 1] if i else self.free_mem[k])),
            )
            for i in range(times.shape[1])
            if np.isfinite(times[k, i])
        ]
        events += [(t, c, m) for node, t, c, m in commits if node == k]
        for t, c, m in sorted(events):
            fc += c
            fm += m
            if fc >= cpu - _EPS and fm >= mem - _EPS:
                return max(t, self.t)
        return np.inf


class Placer(Protocol):
    """A placement policy. ``place`` returns assignments that fit the free capacity now."""

    name: str

    def reset(self, workload: Workload, nodes: Sequence[NodeSpec], seed: int) -> None: ...

    def place(self, view: ClusterView) -> list[tuple[int, int]]: ...


def compress_arrivals(w: Workload, factor: float) -> Workload:
    """``w`` with its jobs arriving ``factor`` times faster after the first (the tasks'
    work unchanged): a trace recorded on a large, lightly loaded cluster becomes a loaded
    one on a few boards."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"compression factor must be a finite number > 0, got {factor!r}")
    if w.n_jobs == 0 or factor == 1.0:
        return w
    first = float(w.job_arrival.min())
    return replace(w, job_arrival=first + (w.job_arrival - first) / factor)


def offered_load(w: Workload, nodes: Sequence[NodeSpec]) -> float:
    """The work the jobs bring per second of their arrival span, over the cluster's
    speed-weighted cores (the synthetic generator's ``load``); inf when every job arrives
    at once, 0 without work. A task larger than every node counts as the simulator runs it,
    shrunk to the largest node (``clamped_tasks``), not as the trace asks."""
    if w.n_tasks == 0 or not nodes:
        return 0.0
    cap_cpu = np.array([n.cpus for n in nodes], dtype=float)
    cap_mem = np.array([n.mem for n in nodes], dtype=float)
    cpu, _, _ = _clamp_demands(w, cap_cpu, cap_mem)
    work = float(np.sum(w.work * cpu))
    cap = sum(n.cpus * n.speed for n in nodes)
    span = float(np.ptp(w.job_arrival)) if w.n_jobs else 0.0
    if work <= 0 or cap <= 0:
        return 0.0
    return work / (cap * span) if span > 0 else math.inf


def makespan_lower_bound(
    w: Workload, nodes: Sequence[NodeSpec], cpu: np.ndarray | None = None
) -> float:
    """The larger of two bounds no schedule can beat (nominal speeds; a ``speed_fn`` that
    only slows a node keeps it valid):

    - path: a job's longest chain cannot start before the job arrives nor run faster than
      the fastest node, so ``max_j a_j + rank_u(root of j) / v_max``;
    - work: the core-seconds of the jobs arriving at or after ``a_j`` need at least their
      total over the cluster's speed-weighted cores, so
      ``max_j a_j + sum_{a_k >= a_j} W_k / sum_n cores_n v_n``.

    Both are measured from the first arrival, like the makespan. ``cpu`` is the demand the
    simulator ran (after clamping to the largest node), the workload's demand by default.
    """
    if w.n_tasks == 0 or not nodes:
        return 0.0
    cpu = w.cpu if cpu is None else cpu
    v_max = max(n.speed for n in nodes)
    cap = sum(n.cpus * n.speed for n in nodes)
    chain = np.zeros(w.n_jobs)
    np.maximum.at(chain, w.task_job, w.rank_u)
    path = float(np.max(w.job_arrival + chain / v_max))
    job_work = np.zeros(w.n_jobs)
    np.add.at(job_work, w.task_job, w.work * cpu)
    order = np.argsort(w.job_arrival, kind="stable")
    after = np.cumsum(job_work[order][::-1])[::-1]
    work = float(np.max(w.job_arrival[order] + after / cap))
    return max(path, work) - float(w.job_arrival.min())


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, eq=False)
class SimResult:
    policy: str
    workload: Workload
    nodes: tuple[NodeSpec, ...]
    start: np.ndarray
    finish: np.ndarray
    node: np.ndarray
    ready_t: np.ndarray
    cpu: np.ndarray  # demand used (after clamping)
    mem: np.ndarray
    clamped: int
    decisions: int

    @property
    def makespan(self) -> float:
        if self.workload.n_tasks == 0:
            return 0.0
        return float(self.finish.max() - self.workload.job_arrival.min())

    @property
    def mean_flow(self) -> float:
        return float(np.mean(self.finish - self.ready_t)) if self.workload.n_tasks else 0.0

    @property
    def mean_wait(self) -> float:
        return float(np.mean(self.start - self.ready_t)) if self.workload.n_tasks else 0.0

    @property
    def mean_jct(self) -> float:
        w = self.workload
        if w.n_jobs == 0:
            return 0.0
        done = np.maximum.reduceat(self.finish, w.job_ptr[:-1])
        return float(np.mean(done - w.job_arrival))

    def metrics(self) -> dict:
        return {
            "policy": self.policy,
            "jobs": self.workload.n_jobs,
            "tasks": self.workload.n_tasks,
            "nodes": len(self.nodes),
            "makespan_s": self.makespan,
            "makespan_lb_s": makespan_lower_bound(self.workload, self.nodes, self.cpu),
            "mean_flow_s": self.mean_flow,
            "mean_wait_s": self.mean_wait,
            "mean_jct_s": self.mean_jct,
            "clamped_tasks": self.clamped,
            "decisions": self.decisions,
        }


# --------------------------------------------------------------------------------------------
# The simulator


class ClusterSim:
    """One run of ``workload`` on ``nodes`` under ``placer``; call :meth:`run` once."""

    def __init__(
        self, workload: Workload, nodes: Sequence[NodeSpec], placer: Placer, seed: int = 0
    ):
        if not nodes:
            raise SimError("the cluster has no node")
        for n in nodes:
            values = (n.cpus, n.mem, n.speed)
            if not all(_positive(x) for x in values):
                raise SimError(
                    f"node {n.name!r}: cpus, mem and speed must be finite and > 0 (got {n.cpus}, {n.mem}, {n.speed})"
                )
            if n.speed_fn is not None and not callable(n.speed_fn):
                raise SimError(f"node {n.name!r}: speed_fn must be callable, got {n.speed_fn!r}")
            sampled = n.speed_fn is not None and getattr(n.speed_fn, "next_change", None) is None
            if sampled and not _positive(n.speed_period_s):
                # 0 or less stepped every 1e-9 s (a hang); NaN silently stopped sampling
                raise SimError(
                    f"node {n.name!r}: speed_period_s must be finite and > 0 for a speed_fn "
                    f"without next_change (got {n.speed_period_s!r})"
                )
        self.w = workload
        self.nodes = tuple(nodes)
        self.placer = placer
        self.seed = seed
        t_n, n_n = workload.n_tasks, len(nodes)
        self.cap_cpu = np.array([n.cpus for n in nodes], dtype=float)
        self.cap_mem = np.array([n.mem for n in nodes], dtype=float)
        self.cpu, self.mem, self.clamped = _clamp_demands(workload, self.cap_cpu, self.cap_mem)
        self.nominal = np.array([n.speed for n in nodes], dtype=float)
        self.speed = self.nominal.copy()
        self.free_cpu = self.cap_cpu.copy()
        self.free_mem = self.cap_mem.copy()
        self.t = float(workload.job_arrival.min()) if workload.n_jobs else 0.0
        self.ready: dict[int, None] = {}
        self.running: set[int] = set()
        self.ready_t = np.full(t_n, np.nan)
        self.start = np.full(t_n, np.nan)
        self.finish = np.full(t_n, np.nan)
        self.run_node = np.full(t_n, -1, dtype=np.int64)
        self.node_of = np.full(t_n, -1, dtype=np.int64)
        self.finish_est = np.full(t_n, np.inf)
        self.pending = workload.npred.copy()
        self.remaining = workload.work.astype(float).copy()
        self.updated = np.zeros(t_n)
        self.version = np.zeros(t_n, dtype=np.int64)
        self.job_unstarted_work = (
            np.add.reduceat(workload.work, workload.job_ptr[:-1])
            if t_n
            else np.zeros(workload.n_jobs)
        )
        self.job_left_tasks = np.diff(workload.job_ptr).copy()
        self.on_node: list[set[int]] = [set() for _ in range(n_n)]
        self.flow_area = 0.0
        self.decisions = 0
        self._heap: list[tuple[float, int, int, int, int]] = []  # (t, seq, kind, id, version)
        self._seq = 0
        self._done = 0

    # events: 0 = task finish, 1 = speed change
    def _push(self, t: float, kind: int, ident: int, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, ident, version))

    def _schedule_speed(self, k: int, at: float | None = None) -> None:
        """The node's next speed event after ``at`` (the event just handled; default now).

        An event handled up to _EPS early (self.t just below its time) must not find itself
        again: the next change after ``self.t`` would be that same time, pushed to
        self.t + _EPS and popped again, for ever.
        """
        fn = self.nodes[k].speed_fn
        base = self.t if at is None else max(self.t, at)
        nxt = getattr(fn, "next_change", None)
        t_next = nxt(base) if nxt is not None else base + self.nodes[k].speed_period_s
        if np.isfinite(t_next):
            self._push(max(t_next, self.t + _EPS), 1, k)

    def _set_speed(self, k: int, at: float | None = None) -> None:
        """The node's speed from ``speed_fn`` at ``at`` (its event's time; default now)."""
        fn = self.nodes[k].speed_fn
        factor = fn(self.t if at is None else max(self.t, at))
        if not _positive(factor):  # inf made the node infinitely fast (flow 0), NaN stalled it
            raise SimError(
                f"node {self.nodes[k].name!r}: speed_fn({self.t:g}) gave {factor!r}, expected a finite factor > 0"
            )
        new = self.nominal[k] * float(factor)
        if not _positive(new):
            raise SimError(
                f"node {self.nodes[k].name!r}: speed_fn({self.t:g}) gave {factor!r}, a speed of {new!r}"
            )
        old = self.speed[k]
        if new != old:
            for task in self.on_node[k]:
                self.remaining[task] = max(
                    self.remaining[task] - (self.t - self.updated[task]) * old, 0.0
                )
                self.updated[task] = self.t
                self.version[task] += 1
                self.finish_est[task] = self.t + self.remaining[task] / new
                self._push(self.finish_est[task], 0, task, int(self.version[task]))
            self.speed[k] = new

    def _arrive(self, j: int) -> None:
        w = self.w
        for task in range(int(w.job_ptr[j]), int(w.job_ptr[j + 1])):
            if self.pending[task] == 0:
                self.ready[task] = None
                self.ready_t[task] = self.t

    def _finish(self, task: int) -> None:
        k = int(self.run_node[task])
        self.finish[task] = self.t
        self.free_cpu[k] += self.cpu[task]
        self.free_mem[k] += self.mem[task]
        self.on_node[k].discard(task)
        self.running.discard(task)
        self.run_node[task] = -1
        self.finish_est[task] = np.inf
        self._done += 1
        self.job_left_tasks[self.w.task_job[task]] -= 1
        w = self.w
        for s in w.succ_idx[w.succ_ptr[task] : w.succ_ptr[task + 1]].tolist():
            self.pending[s] -= 1
            if self.pending[s] == 0:
                self.ready[s] = None
                self.ready_t[s] = self.t

    def _start(self, task: int, k: int) -> None:
        if task not in self.ready:
            state = (
                "running"
                if task in self.running
                else "finished"
                if np.isfinite(self.finish[task])
                else "not ready"
            )
            raise PlacementError(
                f"policy {self.placer.name!r}: task {self.w.task_names[task]!r} is {state}"
            )
        if not 0 <= k < len(self.nodes):
            raise PlacementError(f"policy {self.placer.name!r}: node index {k} out of range")
        if self.cpu[task] > self.free_cpu[k] + _EPS or self.mem[task] > self.free_mem[k] + _EPS:
            raise PlacementError(
                f"policy {self.placer.name!r}: task {self.w.task_names[task]!r} (cpu {self.cpu[task]:g}, mem "
                f"{self.mem[task]:g}) does not fit node {self.nodes[k].name!r} (free cpu {self.free_cpu[k]:g}, mem {self.free_mem[k]:g})"
            )
        del self.ready[task]
        self.running.add(task)
        self.on_node[k].add(task)
        self.free_cpu[k] -= self.cpu[task]
        self.free_mem[k] -= self.mem[task]
        self.start[task] = self.t
        self.run_node[task] = k
        self.node_of[task] = k
        self.updated[task] = self.t
        self.remaining[task] = self.w.work[task]
        self.job_unstarted_work[self.w.task_job[task]] -= self.w.work[task]
        self.version[task] += 1
        self.finish_est[task] = self.t + self.w.work[task] / self.speed[k]
        self._push(self.finish_est[task], 0, task, int(self.version[task]))

    def _maybe_fits(self) -> bool:
        """Cheap test that some ready task fits some node now (skips useless decisions)."""
        ready = np.fromiter(self.ready.keys(), dtype=np.int64, count=len(self.ready))
        c, m = self.cpu[ready], self.mem[ready]
        if c.min() > self.free_cpu.max() + _EPS or m.min() > self.free_mem.max() + _EPS:
            return False
        if ready.size * len(self.nodes) > 20000:
            return True
        fit = (c[:, None] <= self.free_cpu[None, :] + _EPS) & (
            m[:, None] <= self.free_mem[None, :] + _EPS
        )
        return bool(fit.any())

    def _decide(self) -> None:
        if not self.ready or not self._maybe_fits():
            return
        self.decisions += 1
        for task, k in self.placer.place(ClusterView.from_sim(self)):
            self._start(int(task), int(k))

    def run(self) -> SimResult:
        w = self.w
        self.placer.reset(w, self.nodes, self.seed)
        t_n = w.n_tasks
        arrivals = w.job_arrival
        nxt_job = 0
        dynamic = [k for k, n in enumerate(self.nodes) if n.speed_fn is not None]
        for k in dynamic:
            self._set_speed(k)
            self._schedule_speed(k)
        while self._done < t_n:
            t_heap = self._heap[0][0] if self._heap else np.inf
            t_arr = arrivals[nxt_job] if nxt_job < w.n_jobs else np.inf
            t_next = min(t_heap, t_arr)
            if not np.isfinite(t_next):
                raise PlacementError(
                    f"policy {self.placer.name!r} left {len(self.ready)} ready tasks unplaced on an idle cluster at t={self.t:g}"
                )
            self.flow_area += (len(self.ready) + len(self.running)) * (t_next - self.t)
            self.t = float(t_next)
            while nxt_job < w.n_jobs and arrivals[nxt_job] <= self.t + _EPS:
                self._arrive(nxt_job)
                nxt_job += 1
            while self._heap and self._heap[0][0] <= self.t + _EPS:
                t_ev, _, kind, ident, ver = heapq.heappop(self._heap)
                if kind == 0:
                    if ver == self.version[ident] and self.run_node[ident] >= 0:
                        self._finish(ident)
                else:
                    self._set_speed(ident, t_ev)
                    if self._done < t_n:
                        self._schedule_speed(ident, t_ev)
            self._decide()
            if not self.running and self.ready and nxt_job >= w.n_jobs:
                raise PlacementError(
                    f"policy {self.placer.name!r} left {len(self.ready)} ready tasks unplaced on an idle cluster at t={self.t:g}"
                )
        return SimResult(
            policy=self.placer.name,
            workload=w,
            nodes=self.nodes,
            start=self.start,
            finish=self.finish,
            node=self.node_of,
            ready_t=self.ready_t,
            cpu=self.cpu,
            mem=self.mem,
            clamped=self.clamped,
            decisions=self.decisions,
        )


def _clamp_demands(
    w: Workload, cap_cpu: np.ndarray, cap_mem: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Demands that fit at least one node: a task too big for every node is shrunk to the
    largest node's capacity (counted in ``clamped``) so a real trace still runs."""
    cpu, mem = w.cpu.copy(), w.mem.copy()
    fits = (
        ((cpu[:, None] <= cap_cpu[None, :] + _EPS) & (mem[:, None] <= cap_mem[None, :] + _EPS)).any(
            axis=1
        )
        if cpu.size
        else np.zeros(0, bool)
    )
    bad = np.flatnonzero(~fits)
    if bad.size:
        big = int(np.argmax(cap_cpu * 1e6 + cap_mem))
        cpu[bad] = np.minimum(cpu[bad], cap_cpu[big])
        mem[bad] = np.minimum(mem[bad], cap_mem[big])
    return cpu, mem, int(bad.size)


def simulate(
    workload: Workload, nodes: Sequence[NodeSpec], placer: Placer, seed: int = 0
) -> SimResult:
    """Run ``workload`` on ``nodes`` under ``placer`` and return the schedule and metrics."""
    return ClusterSim(workload, nodes, placer, seed).run()
