"""Reference profiles, soft deadlines and the versioned JSON store."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from agents import deadlines
from agents.deadlines import (
    ProfileStore,
    profile_from_dag,
    slowdown,
    soft_deadline,
    span_at,
    work_at,
)
from platforms.dag import DagBuilder
from platforms.errors import SpecError
from platforms.observation import JobProfile
from platforms.spec import load_board

P = JobProfile(
    "fft-medium",
    work_s=4.0,
    span_s=1.0,
    beta=0.25,
    ref_makespan_s=2.0,
    ref_khz=1_000_000,
    ref_cores=4,
)


def test_two_point_scaling():
    assert slowdown(0.0, 1e6, 5e5) == pytest.approx(2.0)
    assert slowdown(0.25, 1e6, 5e5) == pytest.approx(0.75 * 2 + 0.25)
    assert slowdown(0.25, 1e6, 1e6, capacity=1.5) == pytest.approx(0.75 / 1.5 + 0.25)
    assert work_at(P, 500_000) == pytest.approx(4.0 * 1.75)
    # the span is not scaled by the mean beta: without its parts, a path may be all compute
    # below the reference speed (L f_ref / f) and hold all the job's memory time above it
    assert span_at(P, 500_000) == pytest.approx(1.0 * 2.0)
    assert span_at(P, 2_000_000) == pytest.approx(1.0 * 0.5 + min(1.0, 0.25 * 4.0) * 0.5)
    # with them: its compute-only path scaled plus its memory-only path
    parts = replace(P, span_cpu_s=0.6, span_mem_s=0.5)
    assert span_at(parts, 500_000) == pytest.approx(0.6 * 2.0 + 0.5)
    assert span_at(parts, 2_000_000) == pytest.approx(0.6 * 0.5 + 0.5)
    # a nearly finished job: the span can be no longer than the work left
    assert span_at(P, 1_000_000, remaining=0.1) == pytest.approx(0.4)


def test_soft_deadline_and_its_checks():
    assert soft_deadline(P, 1.5, 2_000_000) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="slack .* must be a finite number >= 1"):
        soft_deadline(P, 0.9, 2_000_000)
    tight = replace(P, span_s=3.9, ref_makespan_s=1.0)
    # L(2 GHz) = 3.9 * 0.5 + min(3.9, 0.25 * 4) * 0.5 = 2.45 > 1.2 * 1.0
    with pytest.raises(
        ValueError,
        match=r"shorter than its critical path .* L\(2000000 kHz, capacity 1.0\) = 2.45 s",
    ):
        soft_deadline(tight, 1.2, 2_000_000)
    assert soft_deadline(tight, 2.5, 2_000_000) == pytest.approx(2.5)


def test_profile_from_dag_computes_work_span_beta():
    b = DagBuilder("toy")
    a = b.add(1e9)
    c = b.add(1e9)
    b.add(1e9, mem_s=0.5, preds=[a, c])  # two parallel 1 s tasks, then 1 s + 0.5 s memory
    dag = b.build()
    spec = load_board("tx2")
    p = profile_from_dag(dag, spec, "a57", 2, 960000, 2.9)
    f = 960000e3
    assert p.work_s == pytest.approx(3 * 1e9 / f + 0.5)
    assert p.span_s == pytest.approx(2 * 1e9 / f + 0.5)
    assert p.beta == pytest.approx(0.5 / p.work_s)
    assert (p.name, p.ref_khz, p.ref_cores, p.ref_makespan_s, p.version) == (
        "toy",
        960000,
        2,
        2.9,
        1,
    )
    with pytest.raises(ValueError, match="not in the table of tx2/a57"):
        profile_from_dag(dag, spec, "a57", 2, 1_000_000, 2.9)
    with pytest.raises(ValueError, match="core count 5 is outside 1..4"):
        profile_from_dag(dag, spec, "a57", 5, 960000, 2.9)
    with pytest.raises(KeyError, match="no cluster 'gold'"):
        profile_from_dag(dag, spec, "gold", 1, 960000, 2.9)


def test_store_round_trip_and_freezing(tmp_path):
    store = ProfileStore()
    store.put("tx2", P)
    store.put("orin-nx", replace(P, work_s=2.0, span_s=0.5))
    assert store.put("tx2", P) is store.get("fft-medium", "tx2")  # same cost: no new version
    with pytest.raises(ValueError, match="frozen at version 1"):
        store.put("tx2", replace(P, work_s=5.0))
    newer = store.put("tx2", replace(P, work_s=5.0), replace_existing=True)
    assert newer.version == 2 and store.get("fft-medium", "tx2").work_s == 5.0
    path = tmp_path / "profiles.json"
    deadlines.save(store, path)
    back = deadlines.load(path)
    assert back.profiles == store.profiles and len(back) == 2
    assert json.loads(path.read_text())["format"] == "hidvfs-profiles"
    with pytest.raises(KeyError, match="no reference profile for job 'fib' on board 'tx2'"):
        back.get("fib", "tx2")
    assert back.find("fib", "tx2") is None


def test_store_refuses_bad_files(tmp_path):
    path = tmp_path / "p.json"
    with pytest.raises(SpecError, match="file not found"):
        deadlines.load(path)
    assert len(deadlines.load(path, missing_ok=True)) == 0
    path.write_text(json.dumps({"format": "hidvfs-profiles", "version": 7, "profiles": []}))
    with pytest.raises(SpecError, match="key 'version': expected store version 1.*got 7"):
        deadlines.load(path)
    row = {
        "board": "tx2",
        "name": "x",
        "work_s": 1.0,
        "span_s": 2.0,
        "beta": 0.1,
        "ref_makespan_s": 1.0,
        "ref_khz": 1,
        "ref_cores": 1,
        "version": 1,
    }
    path.write_text(json.dumps({"format": "hidvfs-profiles", "version": 1, "profiles": [row]}))
    with pytest.raises(SpecError, match=r"profiles\[0\].*'span_s' must be <= work_s"):
        deadlines.load(path)
    del row["beta"]
    path.write_text(json.dumps({"format": "hidvfs-profiles", "version": 1, "profiles": [row]}))
    with pytest.raises(SpecError, match=r"key 'profiles\[0\].beta'"):
        deadlines.load(path)
    path.write_text("{not json")
    with pytest.raises(SpecError, match="valid JSON"):
        deadlines.load(path)


@pytest.mark.parametrize(
    "content, why", [(b"\xff\xfe garbage", "UTF-8"), (b"[" * 100000, "nested too deeply")]
)
def test_a_store_that_is_not_text_or_too_deep_is_a_clear_error(tmp_path, content, why):
    """The daemon keeps its last good store on a SpecError; anything else failed every
    registration with an internal error."""
    p = tmp_path / "profiles.json"
    p.write_bytes(content)
    with pytest.raises(SpecError, match=why):
        deadlines.load(p)
