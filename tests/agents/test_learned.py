"""The shipped hidvfs policy: loads from ONNX, decides valid, gated and shielded decisions."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from functools import cache

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agents.deadlines import span_at, work_at
from agents.factory import make_policy
from agents.features import job_remaining
from agents.gate import FederatedGate
from agents.hidvfs import ActionSpace, HidvfsPolicy, choose
from agents.learned import MODELS_DIR, check_board, make_hidvfs
from agents.policy import Decision, JobSetting
from agents.rtfeatures import rt_row, rt_rows_many
from agents.runtime import ModelMismatch, OnnxModel
from agents.schedulability import jobs_from_obs
from agents.stages import SpillStage
from platforms.spec import load_board

BOARDS = ("tx2", "orin-nx", "rubikpi3")


@cache
def observations(board: str, seed: int = 900_123) -> tuple:
    """Observations with running jobs, from a maxfreq run of a held-out-style mix."""
    from daemon.simrun import run_sim
    from tools.agents_episodes import EpisodeSpec, episode_items

    seen = []
    items = episode_items(board, seed, EpisodeSpec(n_jobs=4))
    run_sim(
        board,
        make_policy("maxfreq", load_board(board)),
        items,
        seed=seed,
        on_tick=lambda r: seen.append(r.obs) if r.obs.jobs else None,
    )
    return tuple(seen)


@pytest.mark.parametrize("board", BOARDS)
def test_shipped_models_pass_check(board):
    report = check_board(board)
    assert report["ok"], report
    names = {f["file"] for f in report["files"]}
    assert {"profiler.onnx", "thermal.onnx", "priority.onnx", "response_time.onnx"} <= names
    for f in report["files"]:
        if f["file"].endswith(".onnx"):
            assert f["command"].startswith(f"hidvfs agents train --board {board}")
            # 1e-5, relative to the output scale above 1 (float32 Q-values reach ~300)
            assert f["max_abs_diff"] <= f["tolerance"]


def test_models_of_another_board_are_refused():
    with pytest.raises(ModelMismatch, match="board"):
        OnnxModel(MODELS_DIR / "tx2" / "profiler.onnx", "orin-nx", "profiler")
    with pytest.raises(ModelMismatch):
        make_hidvfs(load_board("orin-nx"), models=MODELS_DIR / "tx2")


@pytest.mark.parametrize("board", BOARDS)
def test_decisions_are_valid(board):
    spec = load_board(board)
    pol = make_policy("hidvfs", spec)
    assert isinstance(pol, HidvfsPolicy) and len(pol.stages) == 3
    tables = {c.name: set(c.freqs_khz) for c in spec.clusters}
    pol.reset(0)
    for obs in observations(board):
        d = pol.decide(obs)
        for st_ in pol.stages:
            d = st_(d, obs)
        online = {c for cl in obs.clusters for c in cl.online}
        assert set(d.freq_khz) == {c.name for c in obs.clusters}
        for name, f in d.freq_khz.items():
            assert f in tables[name]
        assert set(d.jobs) == {j.pid for j in obs.jobs}
        due = {j.pid for j in obs.jobs if j.deadline_s is not None}
        for pid, s in d.jobs.items():
            assert s.cpus and set(s.cpus) <= online
            if s.rt_priority == 0:  # only a best-effort job on a deadline job's cores
                assert pid not in due
                assert any(not set(d.jobs[q].cpus).isdisjoint(s.cpus) for q in due)
            else:
                assert 1 <= s.rt_priority <= 99


@pytest.mark.parametrize("board", BOARDS)
def test_gate_stage_output_is_feasible_when_the_gate_finds_it(board):
    spec = load_board(board)
    pol = make_hidvfs(spec, shield=False)
    gate_stage = pol.stages[0]
    for obs in observations(board)[:40]:
        d = gate_stage(pol.decide(obs), obs)
        jobs = jobs_from_obs(obs)
        if jobs and gate_stage.last is not None and gate_stage.last.feasible:
            reasons, _ = FederatedGate.from_observation(obs).check(d, jobs)
            assert reasons == []


def _tight(obs):
    """The same observation with every deadline job almost out of time."""
    jobs = tuple(
        replace(j, deadline_s=j.elapsed_s + 0.02) if j.deadline_s is not None else j
        for j in obs.jobs
    )
    return obs.with_jobs(jobs)


@pytest.mark.parametrize("board", BOARDS)
def test_shield_raises_frequency_for_a_tight_deadline(board):
    spec = load_board(board)
    pol = make_hidvfs(spec, gate=False)
    shield = pol.stages[0]
    raised = 0
    for obs in observations(board)[:30]:
        o = _tight(obs)
        if not any(j.deadline_s is not None for j in o.jobs):
            continue
        d = pol.decide(o)
        low = Decision({c.name: c.freqs_khz[0] for c in o.clusters}, d.jobs)
        out = shield(low, o)
        for name, f in out.freq_khz.items():
            assert f >= low.freq_khz[name]  # the shield only raises
        raised += any(out.freq_khz[n] > low.freq_khz[n] for n in out.freq_khz)
    assert raised > 0


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_spill_only_adds_cores_at_matching_speed(data):
    board = data.draw(st.sampled_from(BOARDS))
    obs_all = observations(board)
    obs = obs_all[data.draw(st.integers(0, len(obs_all) - 1))]
    space = ActionSpace.of(load_board(board))
    freq = {c.name: data.draw(st.sampled_from(c.freqs_khz)) for c in obs.clusters}
    first = obs.clusters[0]
    jobs = {
        j.pid: JobSetting(first.online[: data.draw(st.integers(1, len(first.online)))], 50)
        for j in obs.jobs
    }
    d = Decision(freq, jobs)
    out = SpillStage()(d, obs)
    for pid, s in d.jobs.items():
        assert set(s.cpus) <= set(out.jobs[pid].cpus)
    home_speed = first.capacity * freq[first.name]
    late = [j.pid for j in obs.jobs if _late(j, d.jobs[j.pid].cpus, first, freq[first.name])]
    for cl in obs.clusters[1:]:
        lent = any(set(cl.cpus) & set(s.cpus) for s in out.jobs.values())
        if lent and any(j.deadline_s is None for j in obs.jobs) is False and not late:
            assert cl.capacity * out.freq_khz[cl.name] >= home_speed - 1e-6
    assert space.clusters[0] == first.name


def _late(j, cpus, cl, khz) -> bool:
    """The Graham bound of the job's remaining work on ``cpus`` passes its deadline."""
    if j.deadline_s is None or j.profile is None or not j.remaining_s > 0:
        return False
    rem = job_remaining(j)
    c, span = work_at(j.profile, khz, cl.capacity, rem), span_at(j.profile, khz, cl.capacity, rem)
    return span + (c - span) / len(cpus) > j.remaining_s


@pytest.mark.parametrize("board", BOARDS)
def test_spill_lends_every_free_core_to_the_late_job_with_the_earliest_deadline(board):
    """At the gate's safest point a job can be late on its cores: the free cores go to it,
    not to best-effort jobs, and a cluster that runs no job runs at its top for it."""
    seen = 0
    for obs in observations(board):
        o = _tight(obs)
        due = sorted(
            (j for j in o.jobs if j.deadline_s is not None and j.profile is not None),
            key=lambda j: (j.remaining_s, j.pid),
        )
        if not due or due[0].remaining_s <= 0:
            continue
        first = o.clusters[0]
        freq = {c.name: c.freqs_khz[0] for c in o.clusters}
        d = Decision(freq, {j.pid: JobSetting(first.online[:1], 50) for j in o.jobs})
        if not _late(due[0], first.online[:1], first, freq[first.name]):
            continue
        seen += 1
        out = SpillStage()(d, o)
        online = {c for cl in o.clusters for c in cl.online}
        assert set(out.jobs[due[0].pid].cpus) == online  # every free core, its own kept
        for j in o.jobs:
            if j.pid != due[0].pid:
                assert out.jobs[j.pid] == d.jobs[j.pid]
        for cl in o.clusters[1:]:  # they ran no job: at the top for the late one
            assert out.freq_khz[cl.name] == (cl.max_khz or cl.freqs_khz[-1])
    assert seen > 0


def test_ablation_options_build_distinct_pipelines():
    spec = load_board("tx2")
    assert len(make_hidvfs(spec).stages) == 3
    assert len(make_hidvfs(spec, shield=False).stages) == 2
    assert len(make_hidvfs(spec, gate=False).stages) == 2
    p = make_hidvfs(spec, variant="noshaping")
    assert p.name == "hidvfs-noshaping"


def test_greedy_policy_is_deterministic():
    spec = load_board("rubikpi3")
    obs = observations("rubikpi3")[:20]
    runs = []
    for _ in range(2):
        pol = make_hidvfs(spec)
        pol.reset(1)
        out = []
        for o in obs:
            d = pol.decide(o)
            out.append((tuple(sorted(d.freq_khz.items())), tuple(sorted(d.jobs.items()))))
        runs.append(out)
    assert runs[0] == runs[1]
    assert not math.isnan(float(np.mean([len(r) for r in runs])))


# ------------------------------------------------------------------------ optimised internals


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_shield_builds_the_rows_the_predictor_was_trained_on(data):
    """rt_rows_many (plain floats or whole-batch numpy) is training's rt_row, bit for bit."""
    board = data.draw(st.sampled_from(BOARDS))
    obs_all = observations(board)
    obs = obs_all[data.draw(st.integers(0, len(obs_all) - 1))]
    online = [c for cl in obs.clusters for c in cl.online]
    jobs = {
        j.pid: JobSetting(
            tuple(sorted(data.draw(st.sets(st.sampled_from(online), min_size=1)))),
            data.draw(st.integers(0, 3)),
        )
        for j in obs.jobs
    }
    d = Decision({c.name: c.freqs_khz[0] for c in obs.clusters}, jobs)
    items = []
    for j in obs.jobs:
        if j.profile is None:
            continue
        cl = data.draw(st.sampled_from(obs.clusters))
        fs = data.draw(st.lists(st.sampled_from(cl.freqs_khz), min_size=1, max_size=30))
        items.append((j, jobs[j.pid], cl.capacity, fs))
    assume(items)
    got = rt_rows_many(items, obs, d)
    want = np.stack([rt_row(j, s, cap, f, obs, d) for j, s, cap, fs in items for f in fs])
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want)


def _reference_choice(inp, nets):
    """The greedy choice head by head with _pick (the per-head rule the batched path keeps)."""
    from agents.hidvfs import HEAD, MAX_CLUSTERS, N_LEVELS, _pick

    inp = copy.deepcopy(inp)
    profiler, thermal, priority = nets
    tz = thermal(inp.therm_x)
    therm = [_pick(tz[ci], inp.therm_mask[ci], None)[0] for ci in range(MAX_CLUSTERS)]
    present = [
        ci for ci in range(MAX_CLUSTERS) if inp.therm_mask[ci].any() and inp.therm_x[ci, 7] > 0
    ]
    if present and all(therm[ci] == 1 for ci in present):
        therm[min(present, key=lambda ci: float(inp.therm_x[ci, 4]))] = 0
    for ci in range(MAX_CLUSTERS):
        if therm[ci] == 1:
            inp.prof_mask_f[ci] = False
            inp.prof_mask_f[ci, 0] = True
            inp.prof_mask_c[ci] = False
            inp.prof_mask_c[ci, 0] = True
    pz = profiler(inp.prof_x[None, :])[0]
    blocks = [pz[ci * HEAD : (ci + 1) * HEAD] for ci in range(MAX_CLUSTERS)]
    levels = [_pick(b[:N_LEVELS], inp.prof_mask_f[ci], None)[0] for ci, b in enumerate(blocks)]
    cores = [_pick(b[N_LEVELS:], inp.prof_mask_c[ci], None)[0] for ci, b in enumerate(blocks)]
    return therm, levels, cores, inp


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_greedy_choice_in_one_call_equals_head_by_head(data):
    from agents.hidvfs import MAX_CLUSTERS, N_CORES, N_LEVELS, PROFILER_OUT, TickInputs

    def arr(shape, dtype, elements):
        n = int(np.prod(shape))
        return np.array(data.draw(st.lists(elements, min_size=n, max_size=n)), dtype).reshape(shape)

    # ties, NaN and -inf included (numpy's argmax: first maximum, first NaN)
    logit = st.floats(-3, 3, width=32) | st.sampled_from([0.0, 1.0, math.nan, -math.inf])
    masks = (
        arr((MAX_CLUSTERS, 2), bool, st.booleans()),
        arr((MAX_CLUSTERS, N_LEVELS), bool, st.booleans()),
        arr((MAX_CLUSTERS, N_CORES), bool, st.booleans()),
    )
    therm_x = arr((MAX_CLUSTERS, 18), np.float32, st.floats(0, 2, width=32))
    inp = TickInputs(np.zeros(38, np.float32), therm_x, np.zeros((0, 15), np.float32), *masks)
    tz = arr((MAX_CLUSTERS, 2), np.float32, logit)
    pz = arr((1, PROFILER_OUT), np.float32, logit)
    nets = (lambda x: pz, lambda x: tz, lambda x: np.zeros((len(x), 1), np.float32))
    if not (masks[0][:, 0] & masks[0][:, 1]).any():
        tz[:] = 0.0  # the thermal net is not run then: every head has one choice at most
    therm, levels, cores, ref_inp = _reference_choice(inp, nets)
    ch = choose(inp, nets, None, MAX_CLUSTERS)
    assert ch.therm.tolist() == therm and ch.levels.tolist() == levels
    assert ch.cores.tolist() == cores and ch.logp == 0.0
    assert np.array_equal(inp.prof_mask_f, ref_inp.prof_mask_f)
    assert np.array_equal(inp.prof_mask_c, ref_inp.prof_mask_c)


@pytest.mark.parametrize("name", ["profiler", "priority", "response_time"])
def test_direct_onnx_run_equals_the_public_run(name):
    m = OnnxModel(MODELS_DIR / "tx2" / f"{name}.onnx", "tx2", name)
    x = np.random.default_rng(3).random((5, m.n_in), dtype=np.float32)
    assert np.array_equal(m(x), m.sess.run(m._out, {m.input_name: x})[0])
    assert np.array_equal(m(x[0]), m(x[:1]))
