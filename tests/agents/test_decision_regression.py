"""The optimised hidvfs decision path gives exactly the decisions captured before optimising.

``tests/agents/data/decisions_<board>.json.gz`` (gzip: ~0.3 MB instead of 2.6) holds, per board, sequences of observations (the
shipped maxfreq run of ``test_learned.observations``, the 20 busiest of the decision benchmark,
and seeded random variants: tight or past deadlines, scaling limits, offline cores, hot zones,
crowds of up to 9 jobs) together with what the shipped policy made of them: the network inputs
and masks, the agents' choices, the decision after each stage (proposal, gate, shield, spill),
the gate's result (feasible, events, allocation, cost), the shield's bounds and the profiler's
active cores. Observations are stored, not re-simulated, so a change to the simulator does not
move the reference. Frequencies, cores, priorities and events compare exactly, floats to 1e-9.

Regenerate (only for an intended decision change, e.g. retrained models), from the repository root::

    python -m tests.agents.test_decision_regression --write

which decides the stored observations again (``--resimulate`` simulates them afresh: the
simulator has changed since they were taken, so every tick would then change).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from dataclasses import asdict, replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from agents.hidvfs import HidvfsPolicy, Recorder
from agents.learned import make_hidvfs
from agents.policy import Decision
from platforms.observation import ClusterObs, JobObs, JobProfile, Observation, RailObs, ZoneObs
from platforms.spec import load_board

BOARDS = ("tx2", "orin-nx", "rubikpi3")
DATA = Path(__file__).with_name("data")
SEED = 20_240_404
N_VARIANTS = 120
EXPLORE_SEED = 7
TOL = 1e-9


# --------------------------------------------------------------------------------------------
# Observations to and from JSON


def obs_to_json(o: Observation) -> dict:
    return asdict(o)


def _tuple(x) -> tuple:
    return tuple(x)


def obs_from_json(d: dict) -> Observation:
    clusters = tuple(
        ClusterObs(
            **{
                **c,
                "cpus": _tuple(c["cpus"]),
                "online": _tuple(c["online"]),
                "freqs_khz": _tuple(c["freqs_khz"]),
                "governors": _tuple(c["governors"]),
                "util": _tuple(c["util"]),
            }
        )
        for c in d["clusters"]
    )
    zones = tuple(ZoneObs(**{**z, "clusters": _tuple(z["clusters"])}) for z in d["zones"])
    rails = tuple(RailObs(**r) for r in d["rails"])
    jobs = tuple(
        JobObs(
            **{
                **j,
                "cpus": _tuple(j["cpus"]),
                "profile": JobProfile(**j["profile"]) if j["profile"] is not None else None,
            }
        )
        for j in d["jobs"]
    )
    return Observation(d["t"], d["board"], clusters, zones, rails, jobs, _tuple(d["errors"]))


# --------------------------------------------------------------------------------------------
# Seeded variants (the paths the maxfreq run rarely takes: repairs, moves, safest, thermal)


def _with_deadlines(o: Observation, rng: np.random.Generator) -> Observation:
    jobs = []
    for j in o.jobs:
        if j.profile is not None and rng.random() < 0.8:
            work = j.profile.work_s * (1.0 - (j.progress or 0.0))
            slack = float(rng.choice([-0.02, 0.01, 0.05, 0.15, 0.4, 0.8, 1.5, 3.0]))
            jobs.append(replace(j, deadline_s=j.elapsed_s + slack * max(work, 1e-3)))
        else:
            jobs.append(j)
    return o.with_jobs(tuple(jobs))


def _with_limits(o: Observation, rng: np.random.Generator) -> Observation:
    out = []
    for c in o.clusters:
        t = c.freqs_khz
        lo = int(rng.integers(0, max(len(t) // 2, 1)))
        hi = int(rng.integers(lo, len(t)))
        cur = min(max(c.cur_khz or t[-1], t[lo]), t[hi])
        out.append(replace(c, min_khz=t[lo], max_khz=t[hi], cur_khz=cur))
    return replace(o, clusters=tuple(out))


def _with_offline(o: Observation, rng: np.random.Generator) -> Observation:
    out = []
    for c in o.clusters:
        keep = [x for x in c.online if rng.random() < 0.6]
        out.append(replace(c, online=tuple(keep)))
    if not any(c.online for c in out):
        out[0] = replace(out[0], online=o.clusters[0].online[:1])
    return replace(o, clusters=tuple(out))


def _hot(o: Observation, rng: np.random.Generator) -> Observation:
    zones = tuple(
        replace(z, temp_c=z.temp_c + float(rng.uniform(15.0, 60.0)))
        if z.clusters and z.temp_c is not None
        else z
        for z in o.zones
    )
    return replace(o, zones=zones)


def _crowd(o: Observation, rng: np.random.Generator) -> Observation:
    if not o.jobs:
        return o
    online = sorted(c for cl in o.clusters for c in cl.online)
    extra = []
    for i in range(int(rng.integers(1, 7))):
        j = o.jobs[int(rng.integers(0, len(o.jobs)))]
        n = int(rng.integers(1, len(online) + 1))
        cpus = tuple(sorted(rng.choice(online, size=n, replace=False).tolist()))
        dl = None if rng.random() < 0.25 else j.elapsed_s + float(rng.uniform(0.02, 2.0))
        prog = None if rng.random() < 0.2 else float(rng.uniform(0.0, 0.95))
        extra.append(
            replace(j, pid=j.pid + 1000 * (i + 1), cpus=cpus, deadline_s=dl, progress=prog)
        )
    return o.with_jobs(o.jobs + tuple(extra))


_KINDS = (_with_deadlines, _with_limits, _with_offline, _hot, _crowd)


def variants(obs: tuple[Observation, ...], seed: int, n: int) -> list[Observation]:
    """``n`` seeded variants of ``obs``, each a random subset of :data:`_KINDS` (in time order)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in sorted(rng.integers(0, len(obs), size=n).tolist()):
        o = obs[k]
        for fn in _KINDS:
            if rng.random() < 0.45:
                o = fn(o, rng)
        out.append(o)
    return out


# --------------------------------------------------------------------------------------------
# What a decision is made of


def decision_json(d: Decision) -> dict:
    return {
        "freq": dict(sorted(d.freq_khz.items())),
        "jobs": {str(p): [list(s.cpus), s.rt_priority, s.nice] for p, s in sorted(d.jobs.items())},
        "governor": dict(sorted(d.governor.items())),
        "cap": dict(sorted(d.cap_khz.items())),
        "events": list(d.events),
    }


def _floats(a: np.ndarray) -> list:
    return np.asarray(a, dtype=np.float64).tolist()


def _f32(a: np.ndarray) -> list:
    """float32 network inputs as their shortest decimals (exact: they round-trip to the bits)."""
    return [float(str(x)) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def tick_json(pol: HidvfsPolicy, obs: Observation) -> dict:
    """Run one full decision and record every stage."""
    gate = pol.gate_stage
    shield = pol.shield_stage
    d = pol.decide(obs)
    stages = [decision_json(d)]
    for st in pol.stages:
        d = st(d, obs)
        stages.append(decision_json(d))
    inp, ch = pol.recorder.inputs[-1], pol.recorder.choices[-1]
    out: dict = {
        "stages": stages,
        "inputs": {
            "prof_x": _f32(inp.prof_x),
            "therm_x": _f32(inp.therm_x),
            "prio_x": _f32(inp.prio_x),
            "therm_mask": inp.therm_mask.tolist(),
            "prof_mask_f": inp.prof_mask_f.tolist(),
            "prof_mask_c": inp.prof_mask_c.tolist(),
        },
        "choice": {
            "therm": ch.therm.tolist(),
            "levels": ch.levels.tolist(),
            "cores": ch.cores.tolist(),
            "prio": _floats(ch.prio),
            "prio_mean": _floats(ch.prio_mean),
            "logp": float(ch.logp),
        },
        "active": {k: list(v) for k, v in sorted(pol.last_active.items())},
    }
    if gate is not None and gate.last is not None:
        g = gate.last
        out["gate"] = {
            "feasible": g.feasible,
            "events": list(g.events),
            "alloc": {
                str(p): [a.cluster, list(a.cpus), a.kind, a.need] for p, a in g.alloc.items()
            },
            "cost": g.cost,
        }
    if shield is not None:
        out["bounds"] = {str(p): b for p, b in sorted(shield.last_bounds.items())}
    pol.recorder.clear()
    return out


def _policy(board: str, run: str) -> HidvfsPolicy:
    spec = load_board(board)
    if run == "explore":
        base = make_hidvfs(spec)
        pol = HidvfsPolicy(
            spec,
            *base.nets,
            shield=base.shield_stage,
            period_s=base.period_s,
            explore_seed=EXPLORE_SEED,
        )
    else:
        pol = make_hidvfs(spec, gate=run != "nogate")
    pol.recorder = Recorder()
    pol.reset(0)
    return pol


#: (run name, sequence name): a fresh, reset policy per pair
RUNS = (
    ("full", "maxfreq"),
    ("full", "busiest"),
    ("full", "variants"),
    ("nogate", "variants"),
    ("explore", "maxfreq"),
    ("explore", "variants"),
)


def run_sequence(board: str, run: str, seq: list[Observation]) -> list[dict]:
    pol = _policy(board, run)
    return [tick_json(pol, o) for o in seq]


# --------------------------------------------------------------------------------------------
# Capture and compare


def capture(board: str, sequences: dict[str, list[Observation]] | None = None) -> dict:
    """The reference of ``board``: ``sequences`` decided again (the stored observations, for
    an intended decision change), or, without them, observations simulated afresh."""
    if sequences is not None:
        seqs = sequences
    else:
        from tests.agents.test_learned import observations

        base = tuple(observations(board))
        busy = sorted(base, key=lambda o: -sum(j.deadline_s is not None for j in o.jobs))[:20]
        seqs = {
            "maxfreq": list(base),
            "busiest": busy,
            "variants": variants(base, SEED, N_VARIANTS),
        }
    return {
        "board": board,
        "note": "python -m tests.agents.test_decision_regression --write",
        "sequences": {k: [obs_to_json(o) for o in v] for k, v in seqs.items()},
        "runs": {f"{run}/{name}": run_sequence(board, run, seqs[name]) for run, name in RUNS},
    }


def assert_same(got, want, where: str) -> None:
    """Exact for ints, strings and bools; floats to 1e-9 (absolute and relative)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {got} != {want}"
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, (int, float)), f"{where}: {got!r} != {want!r}"
        if math.isinf(want) or math.isnan(want):
            assert got == want or (math.isnan(want) and math.isnan(got)), (
                f"{where}: {got} != {want}"
            )
        else:
            assert math.isclose(got, want, rel_tol=TOL, abs_tol=TOL), f"{where}: {got} != {want}"
    else:
        assert got == want and type(got) is type(want), f"{where}: {got!r} != {want!r}"


def _path(board: str) -> Path:
    return DATA / f"decisions_{board}.json.gz"


@cache
def _load(board: str) -> dict:
    return json.loads(gzip.decompress(_path(board).read_bytes()))


@pytest.mark.parametrize("run,name", RUNS)
@pytest.mark.parametrize("board", BOARDS)
def test_decisions_match_the_captured_ones(board, run, name):
    ref = _load(board)
    seq = [obs_from_json(o) for o in ref["sequences"][name]]
    want = ref["runs"][f"{run}/{name}"]
    got = json.loads(json.dumps(run_sequence(board, run, seq)))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"{board} {run}/{name} tick {i}")


@pytest.mark.parametrize("board", BOARDS)
def test_captured_data_exercises_the_repair_paths(board):
    """The reference is only worth something if it covers repairs, safest points and the shield."""
    ticks = [t for runs in _load(board)["runs"].values() for t in runs]
    gate_events = [e for t in ticks if "gate" in t for e in t["gate"]["events"]]
    assert any("proposal infeasible" in e for e in gate_events)
    assert any("no feasible assignment" in e for e in gate_events)
    assert any("moved to another cluster" in e for e in gate_events)
    assert any("shield:" in e for t in ticks for e in t["stages"][-1]["events"])
    # some cluster sent to cool (on orin-nx one zone covers both clusters: when both must
    # cool, the first takes the work as the coolest, so it is the second that cools)
    assert any(
        any(m) and t["choice"]["therm"][ci] == 1
        for t in ticks
        for ci, m in enumerate(t["inputs"]["therm_mask"])
    )
    assert max(len(t["stages"][0]["jobs"]) for t in ticks) >= 6


def test_observations_round_trip_through_json():
    o = _load("tx2")["sequences"]["variants"][3]
    back = obs_from_json(o)
    assert json.loads(json.dumps(obs_to_json(back))) == o
    assert isinstance(back.clusters[0].online, tuple) and isinstance(back.jobs[0].cpus, tuple)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="overwrite the captured decisions")
    ap.add_argument("--board", action="append", choices=BOARDS)
    ap.add_argument(
        "--resimulate",
        action="store_true",
        help="simulate the observations afresh (a changed simulator no longer gives the "
        "stored ones: every tick then changes); default: decide the stored ones again",
    )
    args = ap.parse_args()
    if not args.write:
        ap.error("pass --write to overwrite tests/agents/data/decisions_<board>.json.gz")
    DATA.mkdir(exist_ok=True)
    for board in args.board or BOARDS:
        stored = None
        if not args.resimulate and _path(board).is_file():
            seqs = _load(board)["sequences"]
            stored = {k: [obs_from_json(o) for o in v] for k, v in seqs.items()}
        data = capture(board, stored)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n"
        # mtime=0: the same capture gives the same bytes
        _path(board).write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        print(f"wrote {_path(board)} ({sum(len(v) for v in data['runs'].values())} ticks)")


if __name__ == "__main__":
    main()
