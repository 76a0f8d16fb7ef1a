"""The three-level state of the learned placer, as fixed-size numeric features.

1. **Static hypergraph of each job DAG** (computed once per workload). Every task with
   successors spans a *scatter* hyperedge {task} + successors, every task with parents a
   *gather* hyperedge {task} + parents. Per-task attributes (log work, log rank_u, cores) are
   propagated two hops with the parameter-free hypergraph operator P = Dv^-1 H De^-1 H^T (the
   SGC simplification of a hypergraph convolution), and concatenated with the raw attributes
   and the task's position on its job's critical path.
2. **Dynamic global graph of the cluster**: node states (speed, free cores and memory, time to
   the next release) and active jobs pooled into one context vector with the backlog and the
   arrival state (time since the last job arrived, over the mean gap between arrivals).
   The backlog's drain time and whether the arrival stream has gone quiet (drain phase).
3. **Local bipartite graph** of candidate ready tasks and nodes that can take them now, with
   edge features: run time there, finish-time regret against the best node if one waited
   for it (from the expected releases), packing alignment, fit left over.

One row per (task, node) edge = [static task | dynamic task | node | edge | global context];
the actor scores rows, the critic reads the global context. Identical free nodes collapse
into one class, and the candidate sets are capped so a decision stays cheap on 100 nodes.
Within a placement round, what depends only on the view (task columns, release profile) is
computed once per round and what depends only on the free capacity (fits, earliest finish,
node and edge columns, node classes) once per round for every ready task and node, then
refreshed one node column per commit (a commit changes one node's free capacity); a hold
changes neither, so the decisions that hold tasks for busy nodes cost only the gathers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from platforms.cluster.simcluster import ClusterView, NodeSpec, Workload

N_STATIC = 16
N_DYN = 9
N_NODE = 6
N_EDGE = 7
N_GLOBAL = 11
N_PAIR = N_STATIC + N_DYN + N_NODE + N_EDGE + N_GLOBAL
FEATURE_VERSION = 2
#: seconds since the last arrival, in mean gaps, after which the stream counts as drained
DRAIN_QUIET = 8.0
#: in the drain phase a chain is critical when it needs this share of the backlog's drain time
DRAIN_SHARE = 0.7
#: the node-size feature (cores / 8) is clipped to what the training nodes span
CAP_CPU_MIN, CAP_CPU_MAX = 0.5, 1.0
_EPS = 1e-9


def hypergraph_propagate(w: Workload, x: np.ndarray, hops: int = 2) -> list[np.ndarray]:
    """``[P x, P^2 x, ...]`` with P = Dv^-1 H De^-1 H^T over scatter and gather hyperedges."""
    t_n = w.n_tasks
    members, edges = [], []
    e = 0
    for ptr, idx in ((w.succ_ptr, w.succ_idx), (w.pred_ptr, w.pred_idx)):
        deg = np.diff(ptr)
        owners = np.flatnonzero(deg > 0)
        ids = np.arange(e, e + owners.size)
        members += [owners, idx]
        edges += [ids, np.repeat(ids, deg[owners])]
        e += owners.size
    mem_a = np.concatenate(members) if members else np.zeros(0, np.int64)
    edg_a = np.concatenate(edges) if edges else np.zeros(0, np.int64)
    de = np.bincount(edg_a, minlength=e).astype(float)
    dv = np.bincount(mem_a, minlength=t_n).astype(float)
    out = []
    cur = x
    for _ in range(hops):
        ex = np.zeros((e, x.shape[1]))
        np.add.at(ex, edg_a, cur[mem_a])
        ex /= np.maximum(de, 1)[:, None]
        nx = np.zeros_like(x)
        np.add.at(nx, mem_a, ex[edg_a])
        nx = np.where(dv[:, None] > 0, nx / np.maximum(dv, 1)[:, None], cur)
        out.append(nx)
        cur = nx
    return out


def static_features(w: Workload) -> np.ndarray:
    """``[T, N_STATIC]`` per-task features of the static job hypergraph."""
    t_n = w.n_tasks
    if t_n == 0:
        return np.zeros((0, N_STATIC), np.float32)
    job_cp = np.maximum.reduceat(w.rank_u, w.job_ptr[:-1])[w.task_job]
    job_work = np.add.reduceat(w.work, w.job_ptr[:-1])[w.task_job]
    job_n = np.diff(w.job_ptr)[w.task_job]
    base = np.column_stack([np.log1p(w.work), np.log1p(w.rank_u), w.cpu / 2.0])
    h1, h2 = hypergraph_propagate(w, base, hops=2)
    feats = np.column_stack(
        [
            base,
            w.rank_u / np.maximum(job_cp, _EPS),
            w.mem,
            np.log1p(np.diff(w.succ_ptr)),
            np.log1p(np.diff(w.pred_ptr)),
            np.log1p(job_work),
            np.log1p(job_n),
            np.log1p(w.rank_u - w.work),
            h1,
            h2,
        ]
    )
    assert feats.shape[1] == N_STATIC
    return feats.astype(np.float32)


class LocalState:
    """A view plus the placements already made in this round (ready tasks by position)."""

    def __init__(self, view: ClusterView):
        self.view = view
        self.free_cpu = view.free_cpu.copy()
        self.free_mem = view.free_mem.copy()
        self.n_running = int(view.running.size)
        self.placed: list[tuple[int, int]] = []
        self.taken = np.zeros(view.ready.size, dtype=bool)  # by position in view.ready
        self.reserved = np.zeros(view.n_nodes, dtype=bool)  # held for a waiting task this round
        self.held: list[tuple[int, int]] = []
        self.cache: _ViewCache | None = None
        self.epoch: _EpochCache | None = None

    @property
    def n_ready(self) -> int:
        """Ready tasks not yet taken (placed or held) in this round."""
        return self.taken.size - int(np.count_nonzero(self.taken))

    @property
    def ready(self) -> np.ndarray:
        return self.view.ready[~self.taken]

    def commit(self, task: int, node: int, pos: int | None = None) -> None:
        """Start ``task`` (at ``pos`` in ``view.ready`` when known) on ``node`` in this round."""
        v = self.view
        self.placed.append((task, node))
        if pos is None:
            pos = int(np.flatnonzero(v.ready == task)[0])
        self.taken[pos] = True
        self.free_cpu[node] -= v.cpu[task]
        self.free_mem[node] -= v.mem[task]
        self.n_running += 1
        if self.epoch is not None:  # refresh the committed node's column
            self.epoch.commit(self, node)

    def hold(self, task: int, node: int, pos: int) -> None:
        """Keep ``task`` waiting for the busy ``node``, reserved for it in this round."""
        self.held.append((task, node))
        self.taken[pos] = True
        self.reserved[node] = True
        if self.epoch is not None:  # a hold keeps the epoch: mask the node there
            self.epoch.reserve(node)


class _ViewCache:
    """What stays fixed during one placement round (per view: holds and commits change none
    of it), for every ready task at once."""

    def __init__(self, fb: FeatureBuilder, v: ClusterView):
        w = fb.w
        r = v.ready
        self.profile = v.release_profile()
        self.next_rel = v.next_release()
        n_arr = int(np.searchsorted(w.job_arrival, v.t, side="right"))
        self.active = int(np.count_nonzero(v.job_left_tasks[:n_arr]))
        # quiet time: seconds since the last arrival over the mean gap between arrivals so far
        if n_arr >= 2:
            gap = (w.job_arrival[n_arr - 1] - w.job_arrival[0]) / (n_arr - 1)
            self.quiet = float((v.t - w.job_arrival[n_arr - 1]) / max(gap, 1e-9))
        else:
            self.quiet = 0.0
        self.unstarted = float(v.job_unstarted_work[:n_arr].sum())
        self.drain = self.quiet >= DRAIN_QUIET
        # drain time of the backlog: unstarted work of arrived jobs plus what running tasks
        # still have to do, over the cluster's capacity
        run = v.running
        left = (
            float(((v.finish_est[run] - v.t) * v.speed[v.run_node[run]] * v.cpu[run]).sum())
            if run.size
            else 0.0
        )
        self.drain_s = (self.unstarted + left) / fb.capacity_
        self.work_r = w.work[r]
        self.wait_r = v.t - v.ready_t[r]
        self.cpu_r = v.cpu[r]
        self.mem_r = v.mem[r]
        # distinct core demands: the wait estimate is computed once per level
        self.cpu_levels, self.cpu_level_of = np.unique(self.cpu_r, return_inverse=True)
        self.sorted_work = np.sort(self.work_r)
        self.sorted_rank = np.sort(w.rank_u[r])
        keys = (self.work_r, -w.rank_u[r], v.ready_t[r], v.job_unstarted_work[w.task_job[r]])
        self.orders = (
            np.array([np.argsort(k, kind="stable") for k in keys])
            if r.size > fb.max_tasks
            else np.zeros((0, r.size), np.int64)
        )
        # node size: cores / 8, clipped to the span training saw (tx2 4 cores, orin-nx and
        # rubikpi3 8: 0.5..1.0). In that span the value is unchanged; a larger or smaller node
        # saturates at the nearest trained size instead of feeding the actor a value it never
        # saw (a 64-core node gave 8.0 and the shipped model sent work to a node 4-18x slower)
        self.node_fixed = np.column_stack(
            [
                v.speed / fb.max_speed_,
                np.clip(v.cap_cpu / 8.0, CAP_CPU_MIN, CAP_CPU_MAX),
                np.log1p(self.next_rel),
            ]
        )
        # horizon: the latest completion any active chain could reach at full speed
        tails = [v.t + w.rank_u[r] / fb.max_speed_]
        if run.size:
            tails.append(v.finish_est[run] + (w.rank_u[run] - w.work[run]) / fb.max_speed_)
        self.horizon = (
            float(max(float(np.max(a)) for a in tails if a.size)) if r.size or run.size else v.t
        )
        self.task_block = self._task_block(fb, v)
        self.speedw = v.speed / fb.max_speed_
        self.cap_cpu_sum = float(v.cap_cpu.sum())
        self.cap_speed = float((self.speedw * v.cap_cpu).sum())
        self.mean_speed = float(np.mean(self.speedw))

    def _task_block(self, fb: FeatureBuilder, v: ClusterView) -> np.ndarray:
        """``[R, N_STATIC + N_DYN]`` task columns of every ready task (the two rank columns
        hold the counts below, divided by the number of ready tasks at build time)."""
        w, r = fb.w, v.ready
        jt = w.task_job[r]
        x = np.empty((r.size, N_STATIC + N_DYN), dtype=np.float32)
        x[:, :N_STATIC] = fb.static_[r]
        o = N_STATIC
        x[:, o + 0] = np.log1p(v.t - v.ready_t[r])
        x[:, o + 1] = np.log1p(np.maximum(v.job_unstarted_work[jt], 0.0))
        x[:, o + 2] = v.job_left_tasks[jt] / fb.job_n_[jt]
        x[:, o + 3] = np.log1p(v.t - w.job_arrival[jt])
        self.rank_work = np.searchsorted(self.sorted_work, self.work_r)
        self.rank_rank = np.searchsorted(self.sorted_rank, w.rank_u[r])
        # slack of the task's chain against the horizon: 0 = on the path that sets the makespan
        span = self.horizon - v.t + 1.0
        x[:, o + 6] = np.clip((self.horizon - v.t - w.rank_u[r] / fb.max_speed_) / span, 0.0, 1.0)
        # chain length at full speed against the backlog's drain time, and the critical flag:
        # the chain that sets the horizon, or (once arrivals stopped) one that needs most of
        # the drain time, so that starting it late would extend the makespan
        need = w.rank_u[r] / fb.max_speed_
        x[:, o + 7] = np.log1p(need / (self.drain_s + 1.0))
        x[:, o + 8] = (x[:, o + 6] <= 1e-6) | (self.drain & (need >= DRAIN_SHARE * self.drain_s))
        return x


class _EpochCache:
    """What depends on the free capacity of the round: which ready task fits which node now,
    every ready task's earliest start and finish on every node, the node columns and the
    classes of identical nodes. Built at the round's first decision; :meth:`commit` refreshes
    the one node whose capacity a commit changed. A hold (taken task, reserved node) changes none of it
    (:meth:`reserve` masks the node), so holding costs only the per-decision part of
    :meth:`FeatureBuilder.build`."""

    def __init__(self, fb: FeatureBuilder, s: LocalState):
        v, cc = s.view, s.cache
        self.fb = fb
        c, m = cc.cpu_r, cc.mem_r
        self.now = (c[:, None] <= s.free_cpu[None, :] + _EPS) & (
            m[:, None] <= s.free_mem[None, :] + _EPS
        )
        self.run = cc.work_r[:, None] / v.speed[None, :]
        self.est = np.empty_like(self.run)
        self.eft = np.empty_like(self.run)
        self.edge_block = np.empty((c.size, v.n_nodes, 5), dtype=np.float32)
        self.edge_block[:, :, 0] = np.log1p(self.run)
        self.edge_block[:, :, 4] = np.log1p(
            cc.work_r[:, None] * (1.0 / v.speed - 1.0 / fb.max_speed_)[None, :]
        )
        self.node_block = np.empty((v.n_nodes, N_NODE), dtype=np.float32)
        self.node_block[:, 0] = cc.node_fixed[:, 0]
        self.node_block[:, 3] = cc.node_fixed[:, 1]
        self.node_block[:, 4] = cc.node_fixed[:, 2]
        self._columns(s, np.arange(v.n_nodes))
        self.n_fit = np.count_nonzero(self.now & ~s.reserved[None, :], axis=1)
        self._round(fb, s)

    def _columns(self, s: LocalState, k: np.ndarray) -> None:
        """Fill the capacity-dependent columns of the nodes ``k`` (an index array)."""
        v, cc = s.view, s.cache
        c, m = cc.cpu_r[:, None], cc.mem_r[:, None]
        # earliest finish on every node if the task waited for it (busy nodes included), with
        # this round's placements still holding their cores. The wait estimate counts cores
        # only (one row per distinct core demand, memory checked now)
        times, pc, _ = cc.profile
        held_c = (v.free_cpu[k] - s.free_cpu[k])[:, None]
        ok = pc[k][None] - held_c[None] >= cc.cpu_levels[:, None, None] - _EPS
        first = np.argmax(ok, axis=2)
        later = np.where(ok.any(axis=2), times[k[None, :], first], np.inf)[cc.cpu_level_of]
        est = np.where(self.now[:, k], v.t, np.maximum(later, v.t))
        self.est[:, k] = est
        # earliest finish, inf on reserved nodes
        self.eft[:, k] = np.where(s.reserved[k], np.inf, est + self.run[:, k])
        fc, fm = s.free_cpu[k], s.free_mem[k]
        cap_c, cap_m = v.cap_cpu[k], v.cap_mem[k]
        # edge columns of every (ready task, node) pair (the regret column is filled later)
        eb = self.edge_block
        eb[:, k, 2] = c * fc / cap_c**2 + m * fm / cap_m**2
        eb[:, k, 3] = (fc - c) / cap_c
        nb = self.node_block
        nb[k, 1] = fc / cap_c
        nb[k, 2] = fm / cap_m
        nb[k, 5] = fc >= cap_c - _EPS

    def _round(self, fb: FeatureBuilder, s: LocalState) -> None:
        """The parts over all nodes: classes of identical nodes, the context entries."""
        v, cc = s.view, s.cache
        # classes of identical node state (speed, free and total capacity, next release)
        cols = np.round(
            np.column_stack((v.speed, s.free_cpu, s.free_mem, v.cap_cpu, v.cap_mem, cc.next_rel)),
            6,
        )
        order = np.lexsort(cols.T[::-1])
        key = cols[order]
        new = np.ones(v.n_nodes, dtype=bool)
        new[1:] = (key[1:] != key[:-1]).any(axis=1)
        # nodes by class, then index: the first eligible one of a class is its representative
        self.class_order = order
        self.class_id = np.cumsum(new) - 1
        self.classes: dict = {}  # (min cpu, min mem, cap) -> (eligible, reserved among, reps)
        # the context entries that only change with a commit (the others: see global_context)
        self.context = np.array(
            [
                1.0 - float(s.free_cpu.sum()) / cc.cap_cpu_sum,
                0.0,
                math.log1p(s.n_running),
                math.log1p(cc.active),
                0.0,
                float((cc.speedw * s.free_cpu).sum()) / cc.cap_speed,
                cc.mean_speed,
                0.0,
                math.log1p(cc.unstarted / fb.capacity_),
                math.log1p(cc.quiet),
                float(cc.drain),
            ],
            dtype=np.float32,
        )

    def commit(self, s: LocalState, node: int) -> None:
        """A task started on ``node``: only that node's free capacity changed, so only its
        column is refreshed (O(ready tasks), not O(ready tasks x nodes))."""
        cc = s.cache
        free = ~s.reserved[node]
        if free:
            self.n_fit -= self.now[:, node]
        self.now[:, node] = (cc.cpu_r <= s.free_cpu[node] + _EPS) & (
            cc.mem_r <= s.free_mem[node] + _EPS
        )
        if free:
            self.n_fit += self.now[:, node]
        self._columns(s, np.array([node]))
        self._round(self.fb, s)

    def reserve(self, node: int) -> None:
        """``node`` was reserved by a hold: no task may start or wait there any more."""
        self.eft[:, node] = np.inf
        self.n_fit -= self.now[:, node]


def _pick_tasks(fb: FeatureBuilder, s: LocalState, valid: np.ndarray) -> np.ndarray:
    """Positions of at most ``max_tasks`` candidates among ``valid`` ready positions: the
    shortest, most critical, oldest and those of the jobs with least work left, a quarter
    each (the actor ranks them; this only bounds the cost)."""
    cap = fb.max_tasks
    idx = np.flatnonzero(valid)
    if idx.size <= cap:
        return idx
    q = max(cap // 4, 1)
    # the first q valid positions of each order, order after order
    orders = s.cache.orders
    ok = valid[orders]
    ok &= np.cumsum(ok, axis=1) <= q
    chosen = list(dict.fromkeys(orders[ok].tolist()))
    if len(chosen) < cap:
        extra = [i for i in idx.tolist() if i not in set(chosen)]
        chosen += extra[: cap - len(chosen)]
    return np.array(chosen[:cap], dtype=np.int64)


class FeatureBuilder:
    """Builds the pair matrix and the global context for one decision."""

    def __init__(self, max_tasks: int = 16, max_node_classes: int = 16):
        self.max_tasks = max_tasks
        self.max_node_classes = max_node_classes

    def reset(self, workload: Workload, nodes: Sequence[NodeSpec]) -> None:
        self.w = workload
        self.static_ = static_features(workload)
        # no nodes (an extender request with an empty list): the defaults only avoid 0 / 0
        self.max_speed_ = max((n.speed for n in nodes), default=1.0)
        self.capacity_ = float(sum(n.cpus * n.speed for n in nodes)) or 1.0
        self.job_n_ = np.diff(workload.job_ptr)

    def _node_classes(self, s: LocalState, min_cpu: float, min_mem: float) -> np.ndarray:
        """Nodes that can take the smallest candidate now, one per class of identical state
        (its lowest index); at most ``max_node_classes``, taken round-robin over speed groups
        (most free cores first), so slow nodes stay candidates."""
        ep = s.epoch
        key = (min_cpu, min_mem, self.max_node_classes)
        hit = ep.classes.get(key)
        # a hold reserves a node: the answer stays unless the node was eligible
        if hit is not None and np.count_nonzero(hit[0] & s.reserved) == hit[1]:
            return hit[2]
        elig = (s.free_cpu >= min_cpu - _EPS) & (s.free_mem >= min_mem - _EPS)
        out = self._class_reps(s, np.flatnonzero((elig & ~s.reserved)[ep.class_order]))
        ep.classes[key] = (elig, int(np.count_nonzero(elig & s.reserved)), out)
        return out

    def _fitting_classes(self, s: LocalState, tpos: np.ndarray) -> np.ndarray:
        """Nodes that can take at least one of the candidates ``tpos`` now, one per class
        (capped as :meth:`_node_classes`). Only asked when the classes of that method fit no
        candidate, so it changes no decision that method's classes lead to."""
        ep = s.epoch
        elig = ep.now[tpos].any(axis=0) & ~s.reserved
        return self._class_reps(s, np.flatnonzero(elig[ep.class_order]))

    def _class_reps(self, s: LocalState, e: np.ndarray) -> np.ndarray:
        v, ep = s.view, s.epoch
        if e.size <= 1:
            return ep.class_order[e]
        key = ep.class_id[e]
        new = np.ones(e.size, dtype=bool)
        new[1:] = key[1:] != key[:-1]
        reps = np.sort(ep.class_order[e[new]])
        if reps.size <= self.max_node_classes:
            return reps
        ordered = reps[np.lexsort((-s.free_cpu[reps], -v.speed[reps]))]
        group = np.round(v.speed[ordered], 6)
        # groups in order of first appearance (fastest first), rank of each node in its group
        _, g_first, g_inv = np.unique(group, return_index=True, return_inverse=True)
        g_order = np.argsort(np.argsort(g_first))[g_inv]
        rank = np.empty(ordered.size, dtype=np.int64)
        for g in np.unique(g_inv).tolist():
            sel = np.flatnonzero(g_inv == g)
            rank[sel] = np.arange(sel.size)
        keep = np.lexsort((g_order, rank))[: self.max_node_classes]
        return np.sort(ordered[keep])

    def global_context(self, s: LocalState) -> np.ndarray:
        """``[N_GLOBAL]``: cluster load, ready/running/active counts, backlog, arrival state."""
        if s.cache is None:
            s.cache = _ViewCache(self, s.view)
        if s.epoch is None:
            s.epoch = _EpochCache(self, s)
        cc, ep = s.cache, s.epoch
        keep = ~s.taken
        n_ready = s.n_ready
        g = ep.context.copy()
        g[1] = math.log1p(n_ready)
        g[4] = math.log1p(float(cc.work_r[keep].sum()) / self.capacity_)
        g[7] = math.log1p(float(cc.wait_r[keep].sum()) / n_ready if n_ready else 0.0)
        return g

    def build(self, s: LocalState):
        """``(pairs [P, N_PAIR], pair_task, pair_node, pair_pos, pair_wait, context)``.

        ``pair_pos`` is the task's position in ``view.ready``; ``pair_wait`` marks the edges
        that hold the task for its best (busy) node instead of starting it now. P = 0 (and
        context None) when no ready task fits a node now. What only changes with the view
        or with a commit is cached in ``s`` (see :class:`_ViewCache`, :class:`_EpochCache`).
        """
        v = s.view
        empty = (
            np.zeros((0, N_PAIR), np.float32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, bool),
            None,
        )
        if v.ready.size == 0 or v.n_nodes == 0:  # no nodes: nothing fits (and no context)
            return empty
        g = self.global_context(s)
        cc, ep = s.cache, s.epoch
        # fits some node that is not reserved, now
        valid = (ep.n_fit > 0) & ~s.taken
        if not valid.any():
            return empty
        tpos = _pick_tasks(self, s, valid)
        c, m = cc.cpu_r[tpos], cc.mem_r[tpos]
        nodes = self._node_classes(s, float(c.min()), float(m.min()))
        ti, ni = np.nonzero(ep.now[tpos[:, None], nodes[None, :]])
        if ti.size == 0:
            # the smallest core and memory demands came from different tasks and the capped
            # classes that fit both fit no candidate: take the classes of the nodes that fit
            # some candidate instead (never empty, every candidate fits a free node)
            nodes = self._fitting_classes(s, tpos)
            ti, ni = np.nonzero(ep.now[tpos[:, None], nodes[None, :]])
        eft = ep.eft[tpos]
        bnode = np.argmin(eft, axis=1)
        best = eft.min(axis=1)
        # a "wait" edge per candidate whose best node is busy: hold it for that node
        wi = np.flatnonzero(~ep.now[tpos, bnode] & np.isfinite(best))
        ti = np.concatenate([ti, wi])
        pn = np.concatenate([nodes[ni], bnode[wi]])
        pp = tpos[ti]
        wait = np.zeros(ti.size, dtype=bool)
        wait[ti.size - wi.size :] = True
        delay = np.where(wait, ep.est[pp, pn] - v.t, 0.0)
        pt = v.ready[pp]
        run_here = ep.run[pp, pn]
        n_ready = max(s.n_ready, 1)
        x = np.empty((pt.size, N_PAIR), dtype=np.float32)
        o = N_STATIC + N_DYN
        x[:, :o] = cc.task_block[pp]
        x[:, N_STATIC + 4] = cc.rank_work[pp] / n_ready
        x[:, N_STATIC + 5] = cc.rank_rank[pp] / n_ready
        x[:, o : o + N_NODE] = ep.node_block[pn]
        o += N_NODE
        x[:, o : o + 5] = ep.edge_block[pp, pn]
        x[:, o + 1] = (v.t + delay + run_here - best[ti]) / (run_here + 1.0)
        x[:, o + 5] = wait
        x[:, o + 6] = np.log1p(delay)
        o += N_EDGE
        x[:, o:] = g
        return x, pt, pn, pp, wait, g


# column positions used by the training signals
COL_LOG_WORK = 0
COL_WAIT = N_STATIC + 0
COL_SLACK = N_STATIC + 6
COL_CRITICAL = N_STATIC + 8
COL_SPEED = N_STATIC + N_DYN + 0
COL_REGRET = N_STATIC + N_DYN + N_NODE + 1
COL_LEFTOVER = N_STATIC + N_DYN + N_NODE + 3
COL_IS_WAIT = N_STATIC + N_DYN + N_NODE + 5
COL_QUIET = N_STATIC + N_DYN + N_NODE + N_EDGE + 9
COL_DRAIN = N_STATIC + N_DYN + N_NODE + N_EDGE + 10
COL_LOG_RANK = 1
PRIOR_TAU = 0.05


def topological_prior(x: np.ndarray) -> np.ndarray:
    """``[P]`` topological prior of each edge in 0..1: high for a task on the critical path
    that sets the horizon (slack ~ 0, decaying with ``PRIOR_TAU``), discounted by the
    finish-time regret of the edge (so holding it for its best node scores as starting it
    there, and starting it on a slow node scores less)."""
    return np.exp(-x[:, COL_SLACK] / PRIOR_TAU) * (1.0 - np.clip(x[:, COL_REGRET], 0.0, 1.0))


def sjf_choice(x: np.ndarray, pair_task: np.ndarray) -> int:
    """Index of the edge the ``sjf`` heuristic would take first: shortest task, then the one
    ready longest, then the lowest id, on the fastest node with the best fit; never a wait."""
    key_node = -(x[:, COL_SPEED] - 1e-3 * x[:, COL_LEFTOVER])
    order = np.lexsort(
        (key_node, pair_task, -x[:, COL_WAIT], x[:, COL_LOG_WORK], x[:, COL_IS_WAIT])
    )
    return int(order[0])


def teacher_logits(x: np.ndarray) -> np.ndarray:
    """``[P]`` scores of the mixture teacher (sjf and heft per state): critical tasks (the
    chain that sets the horizon, or in the drain phase a chain needing most of the drain
    time) first by rank_u as heft, the others shortest first as sjf; each task on its
    earliest-finish node (held for it when busy, as heft). The argmax is the teacher's edge."""
    crit = x[:, COL_CRITICAL] > 0.5
    task_key = np.where(crit, 2.0 + x[:, COL_LOG_RANK] / 20.0, 1.0 - x[:, COL_LOG_WORK] / 20.0)
    task_key = task_key + 1e-4 * np.tanh(x[:, COL_WAIT])  # then the one ready longest
    return task_key * 1e4 - np.clip(x[:, COL_REGRET], 0.0, 100.0)


def teacher_choice(x: np.ndarray) -> int:
    """Index of the mixture teacher's edge (see :func:`teacher_logits`)."""
    return int(np.argmax(teacher_logits(x)))


class TeacherModel:
    """The mixture teacher behind the model interface, so it runs through the same
    candidate edges as the learned actor (used for imitation targets and as a reference)."""

    metadata: dict[str, str] = {}

    def logits(self, pairs: np.ndarray) -> np.ndarray:
        return teacher_logits(pairs)

    def value(self, context: np.ndarray) -> float:
        return 0.0
