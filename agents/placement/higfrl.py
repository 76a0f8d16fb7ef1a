"""``higfrl``: a learned actor-critic placer over a three-level graph state.

State (see :mod:`agents.placement.features`): the static hypergraph of each job DAG, the
dynamic global graph of the cluster pooled into a context vector, and the local bipartite
graph of ready tasks and nodes that can take them now. The *allocator* (actor) fuses each
task-node edge's local features with the global context and scores it; a softmax over the
edges gives the policy. The *evaluator* (critic) estimates the return from the global context.
Training (:mod:`agents.placement.train`) starts by imitating a per-state mixture of the sjf
and heft teachers (:func:`features.teacher_logits`), then follows a hybrid reward: the
makespan and flow-time signal of the simulated cluster plus a topological prior for picking
critical-path tasks; the exported checkpoint is the best one on validation traces.

At a decision point the placer picks one edge at a time (greedy argmax when deployed,
sampled when training) until no ready task fits a node. Besides starting a task on a node
that can take it now, the actor may *hold* a task for its earliest-finish node when that node
is busy (the node is then reserved for the rest of the round), as HEFT does; since only busy
nodes can be waited for, the cluster never idles with everything held. A hold changes no
node's free capacity, so the edges are scored once per commit and the holds that follow take
the best remaining edges of that scoring (the held task and the reserved node drop out): a
round that holds many tasks costs a few actor calls, not one per task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agents.placement.features import FeatureBuilder, LocalState, teacher_choice
from platforms.cluster.simcluster import ClusterView, NodeSpec, Workload

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "models" / "cluster" / "higfrl.onnx"


@dataclass
class Trajectory:
    """What a training rollout records: one entry per placement decision."""

    t: list[float] = field(default_factory=list)
    area: list[float] = field(default_factory=list)  # integral of tasks in system so far
    context: list[np.ndarray] = field(default_factory=list)
    # decisions with more than one edge (the only ones with a gradient)
    x: list[np.ndarray] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    teacher: list[int] = field(default_factory=list)  # the mixture teacher's edge
    step_of_x: list[int] = field(default_factory=list)  # which decision each x belongs to


@dataclass
class _Scored:
    """The candidate edges of the last scoring in a round (see :meth:`HigfrlPlacer.select`)."""

    state: LocalState
    n_placed: int
    x: np.ndarray
    pt: np.ndarray
    pn: np.ndarray
    pp: np.ndarray
    pw: np.ndarray
    logits: np.ndarray | None = None


class HigfrlPlacer:
    """The learned placer. ``model`` has ``logits(pairs)`` and ``value(context)``."""

    name = "higfrl"
    score_kind = "logit"  # node_scores: the actor's logits

    def __init__(
        self,
        model=None,
        model_path: str | Path | None = None,
        greedy: bool = True,
        record: bool = False,
        max_tasks: int = 16,
        max_node_classes: int = 16,
    ):
        self.model = model
        self.model_path = model_path
        self.greedy = greedy
        self.record = record
        self.features = FeatureBuilder(max_tasks, max_node_classes)
        self.trajectory = Trajectory()
        self.rng = np.random.default_rng(0)
        self._scored: _Scored | None = None

    def _model(self):
        if self.model is None:
            from agents.placement.onnx_mlp import OnnxPolicyModel

            self.model = OnnxPolicyModel(self.model_path or DEFAULT_MODEL)
        return self.model

    def reset(self, workload: Workload, nodes: Sequence[NodeSpec], seed: int) -> None:
        self._model()
        self.features.reset(workload, nodes)
        self.rng = np.random.default_rng(seed)
        self.trajectory = Trajectory()
        self._scored = None

    def select(self, state: LocalState) -> tuple[int, int, int, bool] | None:
        """One decision ``(task, node, position in view.ready, wait)``, or None when no
        ready task fits a node now. ``wait`` holds the task for its (busy) best node.

        The edges are scored once per commit: a hold changes no node's free capacity, so the
        next decision takes the best of the same scoring among the edges whose task and node
        are still free (a held task, a reserved node drop out). A new scoring starts after a
        commit or when the scored edges run out (new candidates then enter)."""
        sc = self._scored
        alive = None
        if sc is not None and sc.state is state and sc.n_placed == len(state.placed):
            alive = np.flatnonzero(~state.taken[sc.pp] & ~state.reserved[sc.pn])
        if alive is None or alive.size == 0:
            x, pt, pn, pp, pw, _ = self.features.build(state)
            if pt.size == 0:
                self._scored = None
                return None
            sc = self._scored = _Scored(state, len(state.placed), x, pt, pn, pp, pw)
            alive = np.arange(pt.size)
        if alive.size == 1:
            a = 0
        else:
            if sc.logits is None:
                sc.logits = self._model().logits(sc.x)
            logits = sc.logits[alive]
            if self.greedy:
                a = int(np.argmax(logits))
            else:
                cdf = np.cumsum(np.exp(logits - logits.max()))
                a = min(
                    int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right")),
                    cdf.size - 1,
                )
        if self.record:
            tr = self.trajectory
            tr.t.append(state.view.t)
            tr.area.append(state.view.flow_area)
            tr.context.append(self.features.global_context(state))
            if alive.size > 1:
                x = sc.x[alive]
                tr.x.append(x)
                tr.action.append(a)
                tr.teacher.append(teacher_choice(x))
                tr.step_of_x.append(len(tr.t) - 1)
        e = int(alive[a])
        return int(sc.pt[e]), int(sc.pn[e]), int(sc.pp[e]), bool(sc.pw[e])

    def place(self, view: ClusterView) -> list[tuple[int, int]]:
        state = LocalState(view)
        while True:
            pick = self.select(state)
            if pick is None:
                return state.placed
            task, node, pos, wait = pick
            if wait:
                state.hold(task, node, pos)
            else:
                state.commit(task, node, pos)

    def node_scores(self, view: ClusterView, task: int) -> np.ndarray:
        """Actor logits of ``task`` on every node (-inf where it does not fit now)."""
        fb = self.features
        saved = fb.max_node_classes
        fb.max_node_classes = view.n_nodes
        try:
            state = LocalState(view)
            state.taken[:] = view.ready != task
            x, pt, pn, _, pw, _ = fb.build(state)
            x, pt, pn = x[~pw], pt[~pw], pn[~pw]
        finally:
            fb.max_node_classes = saved
        scores = np.full(view.n_nodes, -np.inf)
        if pt.size:
            logits = self._model().logits(x)
            scores[pn] = logits
            # identical nodes collapsed into one class share its score
            fits = (view.free_cpu >= view.cpu[task] - 1e-9) & (
                view.free_mem >= view.mem[task] - 1e-9
            )
            for k in np.flatnonzero(fits & ~np.isfinite(scores)).tolist():
                same = (
                    (view.speed[pn] == view.speed[k])
                    & (view.free_cpu[pn] == view.free_cpu[k])
                    & (view.free_mem[pn] == view.free_mem[k])
                )
                if same.any():
                    scores[k] = logits[np.flatnonzero(same)[0]]
        return scores
