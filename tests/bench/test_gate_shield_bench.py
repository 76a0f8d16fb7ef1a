"""Decision-path cost of the federated gate and the conformal shield (budget: well under 1 ms).

pytest-benchmark reports the times; none is asserted (a timed assertion flakes on a busy
machine). Each benchmark asserts what the timed call returned, so it still checks behaviour
with benchmarking disabled.
"""

from __future__ import annotations

import numpy as np

from agents.gate import FederatedGate
from agents.policy import Decision, JobSetting
from agents.schedulability import GateCluster, GateJob
from agents.shield import Candidates, Shield, SplitConformal
from platforms.observation import JobProfile

# RUBIK Pi 3 shaped: three clusters, silver/gold/prime
CLUSTERS = (
    GateCluster("silver", (0, 1, 2, 3), (300000, 691200, 1017600, 1305600, 1612800, 1958400), 1.0),
    GateCluster("gold", (4, 5, 6), (691200, 1113600, 1555200, 1900800, 2400000), 1.9),
    GateCluster("prime", (7,), (806400, 1420800, 2016000, 2707200), 1.938),
)
JOBS = (
    GateJob(1, JobProfile("a", 4.0, 0.5, 0.2, 4.0, 1_000_000, 1), 1.5),
    GateJob(2, JobProfile("b", 2.0, 1.0, 0.2, 2.0, 1_000_000, 1), 2.5),
    GateJob(3, JobProfile("c", 0.8, 0.3, 0.2, 0.8, 1_000_000, 1), 1.0),
)
ALL = tuple(range(8))
#: what a governor proposes: low clocks, every job on every CPU
INFEASIBLE = Decision(
    {"silver": 300000, "gold": 691200, "prime": 806400}, {j.pid: JobSetting(ALL) for j in JOBS}
)


def test_gate_repair_three_jobs_three_clusters(benchmark):
    gate = FederatedGate(CLUSTERS)
    r = benchmark(gate.repair, INFEASIBLE, JOBS)
    assert r.feasible and r.events


def test_gate_fast_path_on_a_feasible_decision(benchmark):
    gate = FederatedGate(CLUSTERS)
    good = gate.repair(INFEASIBLE, JOBS).decision
    r = benchmark(gate.repair, good, JOBS)
    assert r.decision is good


def test_shield_filter_sixty_candidates(benchmark):
    rng = np.random.default_rng(0)
    k, d = 60, 16
    w = rng.normal(size=d)

    def predictor(x):  # a linear stand-in for the ONNX response-time model
        return x @ w

    cal = SplitConformal(alpha=0.1).fit(rng.normal(size=200))
    feats = rng.normal(size=(k, d))
    pred = feats @ w
    cands = Candidates(
        list(range(k)), feats, proposed=int(np.argmax(pred)), safest=int(np.argmin(pred))
    )
    cost = rng.uniform(1, 5, size=k)
    shield = Shield(predictor, cal)
    deadline = float(np.median(pred))
    r = benchmark(shield.filter, cands, deadline, cost)
    assert r.intervened
