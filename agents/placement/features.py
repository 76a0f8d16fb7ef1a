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
"""

from __future__ import annotations

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

    def hold(self, task: int, node: int, pos: int) -> None:
        """Keep ``task`` waiting for the busy ``node``, reserved for it in this round."""
        self.held.append((task, node))
        self.taken[pos] = True
        self.reserved[node] = True

    def fits_any(self) -> np.ndarray:
        """``[R]`` per ready position: not yet taken and fits some node's free capacity now."""
        v = self.view
        free_cpu = np.where(self.reserved, -1.0, self.free_cpu)
        order = np.argsort(-free_cpu, kind="stable")
        fc = free_cpu[order]
        best_mem = np.maximum.accumulate(self.free_mem[order])
        c, m = v.cpu[v.ready], v.mem[v.ready]
        # number of nodes with at least c free cores (fc is descending)
        cnt = np.searchsorted(-fc, -c + _EPS, side="right")
        ok = cnt > 0
        mem_ok = np.zeros_like(ok)
        mem_ok[ok] = best_mem[cnt[ok] - 1] >= m[ok] - _EPS
        return ok & mem_ok & ~self.taken


class _ViewCache:
    """What stays fixed during one placement round."""

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
        self.sorted_work = np.sort(self.work_r)
        self.sorted_rank = np.sort(w.rank_u[r])
        keys = (self.work_r, -w.rank_u[r], v.ready_t[r], v.job_unstarted_work[w.task_job[r]])
        self.orders = [np.argsort(k, kind="stable") for k in keys] if r.size > fb.max_tasks else []
        self.node_fixed = np.column_stack(
            [v.speed / fb.max_speed_, v.cap_cpu / 8.0, np.log1p(self.next_rel)]
        )
        # horizon: the latest completion any active chain could reach at full speed
        run = v.running
        tails = [v.t + w.rank_u[r] / fb.max_speed_]
        if run.size:
            tails.append(v.finish_est[run] + (w.rank_u[run] - w.work[run]) / fb.max_speed_)
        self.horizon = (
            float(max(float(np.max(a)) for a in tails if a.size)) if r.size or run.size else v.t
        )


def _pick_tasks(fb: FeatureBuilder, s: LocalState, valid: np.ndarray) -> np.ndarray:
    """Positions of at most ``max_tasks`` candidates among ``valid`` ready positions: the
    shortest, most critical, oldest and those of the jobs with least work left, a quarter
    each (the actor ranks them; this only bounds the cost)."""
    cap = fb.max_tasks
    idx = np.flatnonzero(valid)
    if idx.size <= cap:
        return idx
    q = max(cap // 4, 1)
    parts = [perm[valid[perm]][:q] for perm in s.cache.orders]
    chosen = list(dict.fromkeys(np.concatenate(parts).tolist()))
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
        self.max_speed_ = max(n.speed for n in nodes)
        self.capacity_ = float(sum(n.cpus * n.speed for n in nodes))
        self.job_n_ = np.diff(workload.job_ptr)

    def _node_classes(self, s: LocalState, min_cpu: float, min_mem: float) -> np.ndarray:
        """Nodes that can take the smallest candidate now, one per class of identical state."""
        v = s.view
        idx = np.flatnonzero(
            (s.free_cpu >= min_cpu - _EPS) & (s.free_mem >= min_mem - _EPS) & ~s.reserved
        )
        if idx.size <= 1:
            return idx
        cols = np.column_stack(
            (
                v.speed[idx],
                s.free_cpu[idx],
                s.free_mem[idx],
                v.cap_cpu[idx],
                v.cap_mem[idx],
                s.cache.next_rel[idx],
            )
        )
        cols = np.round(cols, 6)
        order = np.lexsort(cols.T[::-1])
        key = cols[order]
        new = np.ones(idx.size, dtype=bool)
        new[1:] = (key[1:] != key[:-1]).any(axis=1)
        reps = np.sort(idx[order[new]])
        if reps.size <= self.max_node_classes:
            return reps
        # round-robin over speed groups, most free cores first, so slow nodes stay candidates
        groups: dict[float, list[int]] = {}
        for k in reps[np.lexsort((-s.free_cpu[reps], -v.speed[reps]))].tolist():
            groups.setdefault(round(float(v.speed[k]), 6), []).append(k)
        out: list[int] = []
        while len(out) < self.max_node_classes and any(groups.values()):
            for g in groups.values():
                if g and len(out) < self.max_node_classes:
                    out.append(g.pop(0))
        return np.array(sorted(out), dtype=np.int64)

    def global_context(self, s: LocalState) -> np.ndarray:
        v = s.view
        if s.cache is None:
            s.cache = _ViewCache(self, v)
        cc = s.cache
        keep = ~s.taken
        n_ready = int(keep.sum())
        ready_work = float(cc.work_r[keep].sum())
        wait = float(cc.wait_r[keep].mean()) if n_ready else 0.0
        speedw = v.speed / self.max_speed_
        return np.array(
            [
                1.0 - float(s.free_cpu.sum()) / float(v.cap_cpu.sum()),
                np.log1p(n_ready),
                np.log1p(s.n_running),
                np.log1p(cc.active),
                np.log1p(ready_work / self.capacity_),
                float((speedw * s.free_cpu).sum() / (speedw * v.cap_cpu).sum()),
                float(np.mean(speedw)),
                np.log1p(wait),
                np.log1p(cc.unstarted / self.capacity_),
                np.log1p(cc.quiet),
                float(cc.drain),
            ],
            dtype=np.float32,
        )

    def build(self, s: LocalState):
        """``(pairs [P, N_PAIR], pair_task, pair_node, pair_pos, pair_wait, context)``.

        ``pair_pos`` is the task's position in ``view.ready``; ``pair_wait`` marks the edges
        that hold the task for its best (busy) node instead of starting it now. P = 0 (and
        context None) when no ready task fits a node now.
        """
        v, w = s.view, self.w
        empty = (
            np.zeros((0, N_PAIR), np.float32),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, bool),
            None,
        )
        valid = s.fits_any()
        if not valid.any():
            return empty
        g = self.global_context(s)
        cc = s.cache
        tpos = _pick_tasks(self, s, valid)
        tasks = v.ready[tpos]
        c, m = v.cpu[tasks], v.mem[tasks]
        nodes = self._node_classes(s, float(c.min()), float(m.min()))
        fit = (c[:, None] <= s.free_cpu[nodes][None, :] + _EPS) & (
            m[:, None] <= s.free_mem[nodes][None, :] + _EPS
        )
        ti, ni = np.nonzero(fit)
        if ti.size == 0:
            return empty
        # earliest finish on every node if the task waited for it (busy nodes included), with
        # this round's placements still holding their cores and reserved nodes excluded. The
        # wait estimate counts cores only (one row per distinct core demand, memory checked now)
        times, pc, _ = cc.profile
        held_c = (v.free_cpu - s.free_cpu)[None, :, None]
        uc, inv = np.unique(c, return_inverse=True)
        ok = pc[None] - held_c >= uc[:, None, None] - _EPS
        first = np.argmax(ok, axis=2)
        later = np.where(ok.any(axis=2), times[np.arange(v.n_nodes)[None, :], first], np.inf)[inv]
        now = (c[:, None] <= s.free_cpu[None, :] + _EPS) & (
            m[:, None] <= s.free_mem[None, :] + _EPS
        )
        est = np.where(now, v.t, np.maximum(later, v.t))
        est[:, s.reserved] = np.inf
        work_t = w.work[tasks]
        eft = est + work_t[:, None] / v.speed[None, :]
        bnode = np.argmin(eft, axis=1)
        best = eft[np.arange(tasks.size), bnode]
        # a "wait" edge per candidate whose best node is busy: hold it for that node
        wi = np.flatnonzero(~now[np.arange(tasks.size), bnode] & np.isfinite(best))
        ti = np.concatenate([ti, wi])
        pn = np.concatenate([nodes[ni], bnode[wi]])
        wait = np.zeros(ti.size, dtype=bool)
        wait[ti.size - wi.size :] = True
        delay = np.where(wait, est[ti, pn] - v.t, 0.0)
        pt = tasks[ti]
        work = work_t[ti]
        spd = v.speed[pn]
        run_here = work / spd
        jt = w.task_job[pt]
        n_ready = max(int((~s.taken).sum()), 1)
        x = np.empty((pt.size, N_PAIR), dtype=np.float32)
        x[:, :N_STATIC] = self.static_[pt]
        o = N_STATIC
        x[:, o + 0] = np.log1p(v.t - v.ready_t[pt])
        x[:, o + 1] = np.log1p(np.maximum(v.job_unstarted_work[jt], 0.0))
        x[:, o + 2] = v.job_left_tasks[jt] / self.job_n_[jt]
        x[:, o + 3] = np.log1p(v.t - w.job_arrival[jt])
        x[:, o + 4] = np.searchsorted(cc.sorted_work, work) / n_ready
        x[:, o + 5] = np.searchsorted(cc.sorted_rank, w.rank_u[pt]) / n_ready
        # slack of the task's chain against the horizon: 0 = on the path that sets the makespan
        span = cc.horizon - v.t + 1.0
        x[:, o + 6] = np.clip((cc.horizon - v.t - w.rank_u[pt] / self.max_speed_) / span, 0.0, 1.0)
        # chain length at full speed against the backlog's drain time, and the critical flag:
        # the chain that sets the horizon, or (once arrivals stopped) one that needs most of
        # the drain time, so that starting it late would extend the makespan
        need = w.rank_u[pt] / self.max_speed_
        x[:, o + 7] = np.log1p(need / (cc.drain_s + 1.0))
        x[:, o + 8] = (x[:, o + 6] <= 1e-6) | (cc.drain & (need >= DRAIN_SHARE * cc.drain_s))
        o += N_DYN
        fixed = cc.node_fixed[pn]
        x[:, o + 0] = fixed[:, 0]
        x[:, o + 1] = s.free_cpu[pn] / v.cap_cpu[pn]
        x[:, o + 2] = s.free_mem[pn] / v.cap_mem[pn]
        x[:, o + 3] = fixed[:, 1]
        x[:, o + 4] = fixed[:, 2]
        x[:, o + 5] = s.free_cpu[pn] >= v.cap_cpu[pn] - _EPS
        o += N_NODE
        x[:, o + 0] = np.log1p(run_here)
        x[:, o + 1] = (v.t + delay + run_here - best[ti]) / (run_here + 1.0)
        x[:, o + 2] = (
            c[ti] * s.free_cpu[pn] / v.cap_cpu[pn] ** 2
            + m[ti] * s.free_mem[pn] / v.cap_mem[pn] ** 2
        )
        x[:, o + 3] = (s.free_cpu[pn] - c[ti]) / v.cap_cpu[pn]
        x[:, o + 4] = np.log1p(work * (1.0 / spd - 1.0 / self.max_speed_))
        x[:, o + 5] = wait
        x[:, o + 6] = np.log1p(delay)
        o += N_EDGE
        x[:, o:] = g
        return x, pt, pn, tpos[ti], wait, g


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
