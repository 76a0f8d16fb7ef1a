"""The spill lends an idle cluster slower than a deadline job's home only while the job's
greedy bound on all of its cores still meets its deadline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents.deadlines import greedy_bound
from agents.features import job_remaining
from agents.policy import Decision, JobSetting
from agents.stages import SpillStage
from tests.agents.test_learned import observations

BOARD = "rubikpi3"  # silver (slow, 4), gold (3), prime (1): silver cannot match gold's speed


def alone_on_gold(where: float, co_runner: bool = False, span_frac: float = 0.05):
    """A deadline job alone on the gold cluster at its top, silver and prime idle.

    Its remaining deadline sits ``where`` of the way from its bound on gold alone (it is not
    late there) to its greedy bound with the four silver cores at their top added; with
    ``where`` > 1 past both. ``span_frac``: its span over its work (a long one makes the slow
    cores raise the bound).
    """
    obs = next(
        o
        for o in observations(BOARD)
        if len(o.jobs) >= 2 and any(j.profile is not None for j in o.jobs)
    )
    j = next(j for j in obs.jobs if j.profile is not None)
    p = j.profile
    k = span_frac * p.work_s / (p.span_cpu_s + p.span_mem_s)  # the span's parts scale with it
    p = replace(
        p, span_s=span_frac * p.work_s, span_cpu_s=k * p.span_cpu_s, span_mem_s=k * p.span_mem_s
    )
    j = replace(j, profile=p)
    by = {c.name: c for c in obs.clusters}
    gold, silver = by["gold"], by["silver"]
    f_gold, f_silver = gold.freqs_khz[-1], silver.freqs_khz[-1]
    home = [(f_gold, gold.capacity)] * len(gold.online)
    rem = job_remaining(j)
    alone = greedy_bound(j.profile, home, rem)
    mixed = greedy_bound(j.profile, home + [(f_silver, silver.capacity)] * len(silver.online), rem)
    remaining = max(alone, mixed) * where if where > 1 else alone + where * (mixed - alone)
    j = replace(j, deadline_s=j.elapsed_s + remaining)
    jobs = [j]
    settings = {j.pid: JobSetting(tuple(gold.online), 50)}
    if co_runner:
        other = next(o for o in obs.jobs if o.pid != j.pid)
        jobs.append(replace(other, deadline_s=None))
        settings[other.pid] = JobSetting(tuple(gold.online)[:1], 0)
    o = obs.with_jobs(tuple(jobs))
    freq = {c.name: c.freqs_khz[0] for c in o.clusters}
    freq["gold"] = f_gold
    return o, j, Decision(freq, settings), silver, (alone, mixed)


@pytest.mark.parametrize("span_frac", [0.01, 0.05, 0.3])
def test_a_deadline_job_borrows_slower_idle_cores_while_its_bound_fits(span_frac):
    o, j, d, silver, _ = alone_on_gold(1.02, span_frac=span_frac)
    out = SpillStage()(d, o)
    assert set(silver.online) <= set(out.jobs[j.pid].cpus)
    assert out.freq_khz["silver"] == silver.freqs_khz[-1]  # lent at its fastest
    assert set(d.jobs[j.pid].cpus) <= set(out.jobs[j.pid].cpus)  # its own kept


def test_not_when_the_bound_with_the_slower_cores_misses_the_deadline():
    o, j, d, silver, (alone, mixed) = alone_on_gold(0.5, span_frac=0.3)
    assert mixed > j.remaining_s > alone  # a long span: the slow cores could make it late
    out = SpillStage()(d, o)
    assert set(silver.cpus).isdisjoint(out.jobs[j.pid].cpus)
    assert out.freq_khz["silver"] == d.freq_khz["silver"]


def test_not_when_another_job_shares_its_cores():
    """A best-effort job on one of its cores: the idle clusters go to the best-effort job (as
    before), never to the deadline job, whose time on the shared core is not its own."""
    o, j, d, silver, _ = alone_on_gold(1.5, co_runner=True)
    out = SpillStage()(d, o)
    assert set(silver.cpus).isdisjoint(out.jobs[j.pid].cpus)


@pytest.mark.parametrize("slack", [1.02, 3.0])
def test_a_cluster_that_matches_its_speed_is_lent_as_before(slack):
    """prime can run as fast as gold: lent at the lowest such OPP, whatever the deadline."""
    o, j, d, _, _ = alone_on_gold(slack)
    prime = next(c for c in o.clusters if c.name == "prime")
    gold = next(c for c in o.clusters if c.name == "gold")
    out = SpillStage()(d, o)
    assert set(prime.online) <= set(out.jobs[j.pid].cpus)
    need = gold.capacity * d.freq_khz["gold"]
    f = out.freq_khz["prime"]
    assert prime.capacity * f >= need - 1e-6
    assert all(prime.capacity * x < need - 1e-6 for x in prime.freqs_khz if x < f)
