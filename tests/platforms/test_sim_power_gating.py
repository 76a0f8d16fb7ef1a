"""Idle power-gating in the plant: when a core gates, what it saves, and what does not gate."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest

from platforms.dag import make_dag
from platforms.errors import SpecError
from platforms.sim.params import parse_sim
from platforms.sim.plant import Plant, SimJob
from platforms.spec import load_board

TX2 = load_board("tx2")
FMAX = 2035200
BOARDS = ["tx2", "orin-nx", "rubikpi3"]


def _params(gated: bool):
    """tx2's parameters with temperature-independent leakage, idle gating on or off."""
    p = dataclasses.replace(parse_sim(TX2), exec_jitter=0.0)
    cls = tuple(
        dataclasses.replace(c, leak_kt=0.0)
        if gated
        else dataclasses.replace(c, leak_kt=0.0, gate_after_s=math.inf, gated_leak=1.0)
        for c in p.clusters
    )
    return dataclasses.replace(p, clusters=cls)


def _saving_per_core(plant: Plant, name: str) -> float:
    """What one gated core of cluster ``name`` saves: its idle clock and most of its leakage."""
    cl = plant.clusters[name]
    cp = plant.params.cluster(name)
    return (1.0 - cp.gated_leak) * cl.leak_core_w + cl.table.coef_w[
        cl.k
    ] * plant.params.idle_activity


@pytest.mark.parametrize("board", BOARDS)
def test_shipped_boards_gate_idle_cores_within_a_few_ms(board):
    for c in parse_sim(load_board(board)).clusters:
        assert 0.0 < c.gate_after_s < 0.01
        assert 0.0 <= c.gated_leak < 0.5


def test_an_idle_board_starts_with_every_core_gated():
    gated = Plant(TX2, params=_params(True), governor="userspace", online=TX2.cpus)
    wfi = Plant(TX2, params=_params(False), governor="userspace", online=TX2.cpus)
    saving = sum(cl.n_online * _saving_per_core(gated, name) for name, cl in wfi.clusters.items())
    assert saving > 0.1  # six cores at the top OPP: a visible share of the CPU rail
    assert wfi.power_w()[1] - gated.power_w()[1] == pytest.approx(saving, rel=1e-9)


def test_a_core_gates_gate_after_s_after_its_task_ends_and_wakes_for_the_next():
    params = _params(True)
    gate_s = params.cluster("a57").gate_after_s
    plant = Plant(TX2, params=params, governor="userspace", online=TX2.cpus)
    sec = 0.05
    dag = make_dag("one", [sec * FMAX * 1e3], [0.0], [], [])
    pid = plant.submit(SimJob(dag, "one"))
    plant.set_affinity(pid, (0,))
    plant.run_until_idle()
    end = plant.t
    assert end == pytest.approx(sec, rel=1e-9)
    just_idle = plant.power_w()[1]
    plant.advance(end + 0.5 * gate_s)
    assert plant.power_w()[1] == pytest.approx(just_idle, rel=1e-9)  # WFI: not gated yet
    plant.advance(end + gate_s)
    assert just_idle - plant.power_w()[1] == pytest.approx(_saving_per_core(plant, "a57"), rel=1e-9)
    again = plant.submit(SimJob(dag, "again", release_t=plant.t + 0.01))
    plant.set_affinity(again, (0,))
    plant.advance(plant.t + 0.02)
    assert plant.cpu_running(0)  # woken: it leaks and switches again
    assert plant.power_w()[1] > just_idle


def test_idle_gaps_shorter_than_gate_after_s_cost_the_same_as_without_gating():
    """Back-to-back jobs on one core with a gap below the residency: the gated plant books
    exactly the WFI plant's energy minus the cores that stay idle throughout."""
    energies = {}
    for gated in (True, False):
        params = _params(gated)
        gate_s = _params(True).cluster("a57").gate_after_s
        plant = Plant(TX2, params=params, governor="userspace", online=(0,))
        dag = make_dag("one", [0.02 * FMAX * 1e3], [0.0], [], [])
        release = 0.0
        for k in range(5):
            plant.submit(SimJob(dag, f"j{k}", release_t=release))
            release += 0.02 + 0.4 * gate_s
        plant.run_until_idle()
        plant.advance(0.2)
        energies[gated] = (plant.cpu_energy_j, plant)
    e_gated, pg = energies[True]
    e_wfi, _ = energies[False]
    end = 5 * 0.02 + 4 * 0.4 * _params(True).cluster("a57").gate_after_s
    # only cpu0 is online; after the last job it gates gate_after_s later, until t = 0.2
    gated_s = 0.2 - end - pg.params.cluster("a57").gate_after_s
    assert e_wfi - e_gated == pytest.approx(gated_s * _saving_per_core(pg, "a57"), rel=1e-6)


def _bad(mutate) -> SpecError:
    sim = copy.deepcopy(TX2.sim)
    mutate(sim["clusters"]["a57"])
    with pytest.raises(SpecError) as e:
        parse_sim(dataclasses.replace(TX2, sim=sim))
    return e.value


def test_gating_keys_are_checked_and_named():
    assert _bad(lambda c: c.pop("gate_after_s")).key == "sim.clusters.a57.gate_after_s"
    assert _bad(lambda c: c.update(gated_leak=1.5)).key == "sim.clusters.a57.gated_leak"
    assert _bad(lambda c: c.update(gate_after_s=-0.001)).key == "sim.clusters.a57.gate_after_s"
    assert _bad(lambda c: c.update(gate_afters=0.002)).key == "sim.clusters.a57.gate_afters"


def test_a_cluster_without_gating_keys_never_gates():
    sim = copy.deepcopy(TX2.sim)
    for c in sim["clusters"].values():
        c.pop("gate_after_s")
        c.pop("gated_leak")
    p = parse_sim(dataclasses.replace(TX2, sim=sim))
    assert all(c.gate_after_s == math.inf and c.gated_leak == 1.0 for c in p.clusters)
