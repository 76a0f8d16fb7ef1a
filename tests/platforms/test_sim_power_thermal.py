"""Plant power and thermal model: exact energy, exact ZOH, time constants, leakage, throttling."""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pytest
import scipy.linalg
from scipy.optimize import curve_fit

from platforms.dag import DagBuilder, make_dag
from platforms.errors import SpecError
from platforms.sim.params import ThermalLink, ThermalNode, ZoneMap, parse_sim
from platforms.sim.plant import Plant, SimJob
from platforms.sim.thermal import ThermalNetwork
from platforms.spec import load_board

TX2 = load_board("tx2")
BOARDS = ["tx2", "orin-nx", "rubikpi3"]
FMAX = 2035200


def busy_job(seconds: float, n: int = 1, khz: int = FMAX, capacity: float = 1.0):
    """``n`` independent compute-bound tasks of ``seconds`` each at ``khz``."""
    c = seconds * khz * 1e3 * capacity
    return make_dag("busy", [c] * n, [0.0] * n, [], [])


def run_to(plant: Plant, t: float) -> None:
    """Advance to ``t`` through job releases and completions."""
    while plant.t < t:
        plant.advance(t)


def no_leak_temp(params):
    """The same parameters with temperature-independent leakage (a linear thermal system)."""
    return dataclasses.replace(
        params, clusters=tuple(dataclasses.replace(c, leak_kt=0.0) for c in params.clusters)
    )


# -- energy is the exact integral of the reported power -----------------------------------------


def _three_pinned_jobs(params) -> Plant:
    plant = Plant(TX2, params=params, governor="userspace", online=TX2.cpus)
    for k, (sec, cpu) in enumerate([(0.31, 0), (0.52, 3), (0.77, 1)]):
        b = DagBuilder(f"t{k}")
        b.add(sec * FMAX * 1e3 * 0.7, sec * 0.3)  # compute + memory stall
        pid = plant.submit(SimJob(b.build(), f"t{k}", release_t=0.123 * (k + 1)))
        plant.set_affinity(pid, (cpu,))
    return plant


def test_energy_is_exact_sum_of_piecewise_constant_power():
    """Sample the power at every instant it can change: the sum equals the booked energy.

    Those instants are the thermal ticks, the frequency switch, the plant's events and, as
    the shipped board power-gates idle cores, each job's end plus ``gate_after_s``."""
    params = dataclasses.replace(parse_sim(TX2), exec_jitter=0.0)
    gate_s = params.cluster("a57").gate_after_s
    assert gate_s < params.thermal_step_s  # gating instants fall between the ticks
    plant = _three_pinned_jobs(params)
    e0, c0 = plant.energy_j, plant.cpu_energy_j
    total = cpu = 0.0
    t = plant.t
    p_tot, p_cpu = plant.power_w()
    switch_at = 0.5 + TX2.cluster("a57").transition_latency_ns * 1e-9
    grid = [k * params.thermal_step_s for k in range(1, 151)] + [0.5, switch_at]
    heapq.heapify(grid)
    seen = 0
    while grid:
        target = heapq.heappop(grid)
        if target <= t:
            continue
        t_new = plant.advance(target)
        total += p_tot * (t_new - t)
        cpu += p_cpu * (t_new - t)
        t = t_new
        if t < target:  # stopped at an event: come back for the target
            heapq.heappush(grid, target)
        if t == 0.5:
            plant.set_freq("a57", 960000)
        for t_ev, kind, _ in plant.events[seen:]:
            if kind == "finish":  # its core gates gate_s later
                heapq.heappush(grid, t_ev + gate_s)
        seen = len(plant.events)
        p_tot, p_cpu = plant.power_w()
    assert plant.freq_khz("a57") == 960000
    assert sum(kind == "finish" for _, kind, _ in plant.events) == 3
    assert plant.energy_j - e0 == pytest.approx(total, rel=1e-12)
    assert plant.cpu_energy_j - c0 == pytest.approx(cpu, rel=1e-12)


def _sampled_energy(dag, h: float) -> tuple[float, float]:
    plant = Plant(TX2, online=TX2.cpus)
    plant.submit(SimJob(dag, "dag"))
    t, integral = 0.0, 0.0
    p = plant.power_w()[0]
    while plant.active_jobs():
        t_new = plant.advance(t + h)
        integral += p * (t_new - t)
        t, p = t_new, plant.power_w()[0]
    return plant.energy_j, integral


def test_energy_matches_finely_sampled_power_on_a_dag():
    """Left Riemann sums of the reported power converge to the booked energy as h -> 0."""
    rng = np.random.default_rng(0)
    n = 120
    src = [i - 1 for i in range(1, n) if i % 4]
    dst = [i for i in range(1, n) if i % 4]
    dag = make_dag("dag", rng.uniform(2e7, 8e7, n), rng.uniform(0, 0.01, n), src, dst)
    e, coarse = _sampled_energy(dag, 2e-4)
    e2, fine = _sampled_energy(dag, 2e-5)
    assert e == e2
    assert abs(fine - e) < abs(coarse - e) / 5
    assert fine == pytest.approx(e, rel=1e-3)


@pytest.mark.parametrize("board", BOARDS)
def test_rails_add_up_and_history_averages_power(board):
    spec = load_board(board)
    plant = Plant(spec)
    plant.submit(SimJob(busy_job(0.35, n=spec.ncpus, khz=spec.clusters[0].fmax_khz), "load"))
    run_to(plant, 1.0)
    rails = plant.rail_power_w()
    sub = sum(
        w for name, w in rails.items() if name in {r.name for r in spec.rails if r.role == "sub"}
    )
    other = next((r.base_w for r in plant.params.rails if r.name == "other"), 0.0)
    assert rails["_total"] >= rails["_cpu"] + sub + other - 1e-12
    if spec.total_rail:
        assert plant.rail_energy_j[spec.total_rail.name] == pytest.approx(plant.energy_j)
    if spec.cpu_rail:
        assert plant.rail_energy_j[spec.cpu_rail.name] == pytest.approx(plant.cpu_energy_j)
    h = plant.history
    assert len(h.t) == 10 and h.t[-1] == pytest.approx(1.0)
    assert np.mean(h.power_w) == pytest.approx(plant.energy_j / 1.0, rel=1e-9)
    assert max(h.power_w[:3]) > h.power_w[-1]  # the load ended at 0.35 s


# -- thermal network: exact ZOH ------------------------------------------------------------------


@pytest.mark.parametrize("board", BOARDS)
def test_zoh_matrices_equal_the_matrix_exponential(board):
    net = ThermalNetwork.from_params(parse_sim(load_board(board)))
    a = -net.g / net.cap[:, None]
    b = np.diag(1.0 / net.cap)
    for dt in (0.01, 0.37, 30.0):
        phi, gamma = net.matrices(dt)
        e = scipy.linalg.expm(a * dt)
        assert np.allclose(phi, e, rtol=1e-10, atol=1e-13)
        assert np.allclose(
            gamma, np.linalg.solve(a, (e - np.eye(net.n)) @ b), rtol=1e-9, atol=1e-12
        )


def test_plant_temperatures_follow_the_exact_response():
    params = no_leak_temp(dataclasses.replace(parse_sim(TX2), exec_jitter=0.0))
    plant = Plant(TX2, params=params, governor="userspace")
    rise0 = [plant.node_temps_c()[n] - plant.ambient_c for n in plant.net.names]
    plant.submit(SimJob(busy_job(30.0, n=4), "load"))
    p_nodes = [a + b for a, b in zip(plant._nonleak_node_power(), plant._leak_node_power(rise0))]
    run_to(plant, 20.0)
    expected = plant.ambient_c + plant.net.response(rise0, p_nodes, 20.0)
    got = [plant.node_temps_c()[n] for n in plant.net.names]
    assert np.allclose(got, expected, atol=1e-8)


def _two_node_params(step_s=0.05):
    """A die node and a package node: well-separated, known time constants."""
    p = no_leak_temp(dataclasses.replace(parse_sim(TX2), exec_jitter=0.0, thermal_step_s=step_s))
    zones = tuple(
        ZoneMap(
            z.type, "mix", ("die" if z.type in ("BCPU-therm", "MCPU-therm") else "pkg",), (1.0,)
        )
        for z in p.zones
    )
    return dataclasses.replace(
        p,
        nodes=(ThermalNode("die", 0.8), ThermalNode("pkg", 90.0, 2.0)),
        links=(ThermalLink("die", "pkg", 2.5),),
        zones=zones,
        clusters=tuple(dataclasses.replace(c, node="die") for c in p.clusters),
        rails=tuple(dataclasses.replace(r, node="pkg") for r in p.rails),
        cpu_uncore_node="pkg",
    )


def _fit_two_exp(t, y, guess):
    def model(t, y_inf, a1, tau1, a2, tau2):
        return y_inf + a1 * np.exp(-t / tau1) + a2 * np.exp(-t / tau2)

    p0 = [y[-1], (y[0] - y[-1]) / 4, guess[0] * 1.5, (y[0] - y[-1]) * 3 / 4, guess[1] * 0.7]
    popt, _ = curve_fit(model, t, y, p0=p0, maxfev=20000)
    return sorted((popt[2], popt[4]))


def test_step_response_has_the_configured_time_constants():
    params = _two_node_params()
    plant = Plant(TX2, params=params, governor="userspace")
    taus = plant.net.time_constants()
    assert taus[0] < 5 < 60 < taus[1]  # die seconds, package minutes
    plant.submit(SimJob(busy_job(900.0, n=4), "load"))
    run_to(plant, 1800.0)
    h = plant.history
    t, y = np.array(h.t), np.array(h.temp_c["BCPU-therm"])
    heat, cool = t <= 900.0 + 1e-9, t > 900.0 + 1e-9
    assert y[heat][-1] > y[0] + 5  # rises under load
    assert y[cool][-1] < y[heat][-1] - 5  # decays when idle
    for mask, t0 in ((heat, 0.0), (cool, 900.0)):
        fitted = _fit_two_exp(t[mask] - t0, y[mask], taus)
        assert fitted == pytest.approx(list(taus), rel=0.03)


@pytest.mark.parametrize("board", BOARDS)
def test_shipped_boards_die_seconds_package_minutes(board):
    taus = ThermalNetwork.from_params(parse_sim(load_board(board))).time_constants()
    assert 0.3 <= taus[0] <= 10.0
    assert 60.0 <= taus[-1] <= 1200.0


@pytest.mark.parametrize("board", BOARDS)
def test_temperature_rises_under_load_and_decays_idle(board):
    spec = load_board(board)
    plant = Plant(spec)
    idle = plant.temps_c()
    plant.submit(SimJob(busy_job(20.0, n=spec.ncpus), "load"))
    plant.run_until_idle()
    hot = {z: max(v) for z, v in plant.history.temp_c.items()}
    run_to(plant, plant.t + 60.0)
    cooled = plant.temps_c()
    zones = [
        z.type
        for z in spec.zones
        if z.role == "cpu" and z.type in hot and any(plant.clusters[c].n_online for c in z.clusters)
    ]
    assert zones
    for z in zones:
        assert hot[z] > idle[z] + 1.0  # rises under load
        assert cooled[z] - idle[z] < 0.5 * (hot[z] - idle[z])  # the die part decays in seconds
    assert plant.peak_temp_c == pytest.approx(max(hot[z] for z in zones), abs=1e-9)
    (job,) = plant.jobs.values()
    assert plant.peak_temp_c >= job.peak_temp_c > idle[zones[0]] - 1e-9


def test_leakage_grows_with_temperature():
    cool, hot = Plant(TX2, ambient_c=20.0), Plant(TX2, ambient_c=60.0)
    p_cool, p_hot = cool.power_w()[1], hot.power_w()[1]
    leak = parse_sim(TX2).cluster("a57")
    ratio = np.exp(leak.leak_kt * 40.0)
    assert p_hot > p_cool
    stat_cool = sum(cl.leak_core_w * cl.n_online for cl in cool.clusters.values())
    stat_hot = sum(cl.leak_core_w * cl.n_online for cl in hot.clusters.values())
    assert stat_hot / stat_cool == pytest.approx(ratio, rel=0.05)


# -- the board's own throttling ------------------------------------------------------------------


def test_throttling_caps_frequency_at_the_passive_trip_and_releases_it():
    zone = TX2.zone("BCPU-therm")
    trip, hyst = zone.passive_trip_mc / 1000, zone.trips[0].hyst_mc / 1000
    plant = Plant(TX2, ambient_c=74.0, governor="userspace", online=TX2.cpus)
    assert plant.temps_c()["BCPU-therm"] < trip - hyst  # idle: below the trip
    cyc = 300.0 * FMAX * 1e3
    plant.submit(SimJob(make_dag("six", [cyc] * 4 + [cyc * 1.3] * 2, [0.0] * 6, [], []), "hot"))
    run_to(plant, 250.0)
    h = plant.history
    freqs = np.array(h.freq_khz["a57"])
    temps = np.array(h.temp_c["BCPU-therm"])
    assert plant.throttled("a57") and plant.freq_khz("a57") < FMAX
    first = int(np.argmax(freqs < FMAX))
    assert first > 0 and temps[first - 1] >= trip  # the cap engaged at the trip point
    assert temps[: first - 1].max() < trip
    assert temps.max() <= trip + 0.5  # and holds the zone there, one OPP per period
    assert np.all(np.diff(freqs[first:]) <= 0) or temps[first:].min() < trip - hyst
    plant.run_until_idle()
    run_to(plant, plant.t + 30.0)
    assert not plant.throttled("a57") and plant.freq_khz("a57") == FMAX


# -- public anchors ------------------------------------------------------------------------------


def test_tx2_cpu_rail_with_six_cores_busy_at_2035_mhz():
    plant = Plant(TX2, online=TX2.cpus, governor="userspace")
    plant.submit(
        SimJob(
            make_dag(
                "six", [200.0 * FMAX * 1e3] * 4 + [200.0 * FMAX * 1e3 * 1.3] * 2, [0.0] * 6, [], []
            ),
            "six",
        )
    )
    run_to(plant, 120.0)  # warm up
    assert all(plant.cpu_running(c) for c in TX2.cpus)
    total, cpu = plant.power_w()
    assert 3.2 <= cpu <= 3.5
    assert 30.0 <= plant.temps_c()["BCPU-therm"] <= 50.0
    assert total > cpu + 1.0


def test_orin_nx_idle_rails_read_the_tegrastats_sample():
    """boards.md 3.7: an idle Orin NX reads VDD_IN 4824 mW, VDD_CPU_GPU_CV 518 mW; idle here
    is what schedutil leaves: every cluster at its lowest OPP, its cores power-gated."""
    spec = load_board("orin-nx")
    plant = Plant(spec, governor="userspace")
    for cs in spec.clusters:
        plant.set_freq(cs.name, cs.fmin_khz)
    plant.advance(1.0)
    rails = plant.rail_power_w()
    assert rails["VDD_CPU_GPU_CV"] == pytest.approx(0.518, rel=0.03)
    assert rails["VDD_IN"] == pytest.approx(4.824, rel=0.03)


# -- spec validation -----------------------------------------------------------------------------


def _bad(mutate) -> SpecError:
    sim = {**TX2.sim}
    mutate(sim)
    with pytest.raises(SpecError) as err:
        parse_sim(dataclasses.replace(TX2, sim=sim))
    return err.value


def test_spec_errors_name_the_sim_key():
    def short_volts(s):
        s["clusters"] = {**s["clusters"], "a57": {**s["clusters"]["a57"], "volt_v": [0.8, 0.9]}}

    assert _bad(short_volts).key == "sim.clusters.a57.volt_v"

    def bad_node(s):
        s["clusters"] = {**s["clusters"], "denver": {**s["clusters"]["denver"], "node": "gpu"}}

    assert _bad(bad_node).key == "sim.clusters.denver.node"

    def unmapped_zone(s):
        s["thermal"] = {
            **s["thermal"],
            "zones": {k: v for k, v in s["thermal"]["zones"].items() if k != "GPU-therm"},
        }

    assert "GPU-therm" in str(_bad(unmapped_zone))

    def typo(s):
        s["ambiant_c"] = 30

    assert _bad(typo).key == "sim.ambiant_c"

    def bad_mix(s):
        s["thermal"] = {
            **s["thermal"],
            "zones": {**s["thermal"]["zones"], "Tdiode_tegra": {"mix": {"soc": 0.5}}},
        }

    assert _bad(bad_mix).key == "sim.thermal.zones.Tdiode_tegra.mix"

    def no_ambient_path(s):
        s["thermal"] = {
            **s["thermal"],
            "nodes": [{**n, "r_amb_k_w": None} for n in s["thermal"]["nodes"]],
        }

    assert _bad(no_ambient_path).key == "sim.thermal.nodes"

    def missing_subrail(s):
        s["rails"] = {k: v for k, v in s["rails"].items() if k != "VDD_SYS_DDR"}

    assert "VDD_SYS_DDR" in str(_bad(missing_subrail))
    with pytest.raises(SpecError, match="'sim'"):
        parse_sim(dataclasses.replace(TX2, sim={}))


# -- a board soaked hot at the start, time under the cap, leakage at a frequency switch ----------


@pytest.mark.parametrize("board", BOARDS)
def test_a_soaked_board_starts_at_its_temperature_and_cools_to_its_ambient(board):
    spec = load_board(board)
    plant = Plant(spec, ambient_c=30.0, start_c=80.0)
    zones = [z for z in spec.zones if z.role == "cpu"]
    offsets = {z.type: z.offset_c for z in parse_sim(spec).zones}
    for z in zones:
        assert plant.temps_c()[z.type] == pytest.approx(80.0 + offsets.get(z.type, 0.0), abs=1e-9)
    assert list(plant.node_temps_c().values()) == pytest.approx([80.0] * plant.net.n)
    if board != "tx2":  # one board cools the whole way (some seconds of simulation)
        return
    run_to(plant, 4000.0)  # > 5 time constants of the slowest node
    idle = Plant(spec, ambient_c=30.0)  # the idle steady state at that ambient
    for z in zones:
        assert plant.temps_c()[z.type] == pytest.approx(idle.temps_c()[z.type], abs=0.5)


def test_a_soaked_board_leaks_as_its_temperature_says():
    leak = parse_sim(TX2).cluster("a57")
    cold, hot = Plant(TX2, ambient_c=25.0, start_c=25.0), Plant(TX2, ambient_c=25.0, start_c=75.0)
    a, b = cold.clusters["a57"].leak_core_w, hot.clusters["a57"].leak_core_w
    assert b / a == pytest.approx(np.exp(leak.leak_kt * 50.0), rel=1e-9)


@pytest.mark.parametrize("start_c", [float("nan"), float("inf"), -41.0, 151.0])
def test_an_implausible_start_temperature_is_refused(start_c):
    with pytest.raises(ValueError, match="start_c"):
        Plant(TX2, start_c=start_c)


def test_throttled_time_counts_the_periods_under_the_kernel_cap():
    cyc = 5.0 * FMAX * 1e3
    six = make_dag("six", [cyc] * 6, [0.0] * 6, [], [])
    cool = Plant(TX2, governor="userspace", online=TX2.cpus)
    cool.submit(SimJob(six, "six"))
    cool.run_until_idle()
    assert cool.throttled_s == 0.0
    trip = TX2.zone("BCPU-therm").passive_trip_mc / 1000
    hot = Plant(TX2, ambient_c=40.0, start_c=trip + 2.0, governor="userspace", online=TX2.cpus)
    hot.submit(SimJob(six, "six"))
    period = parse_sim(TX2).throttle_period_s
    capped = 0
    while hot.jobs and any(js.finish_t is None for js in hot.jobs.values()):
        hot.advance(hot.t + period / 4)
        capped += hot.throttled("a57") or hot.throttled("denver")
    assert hot.throttled_s > 0.0
    # counted per polling period: within a period of the time a cap was seen in force
    assert hot.throttled_s == pytest.approx(capped * period / 4, abs=2 * period)


def test_leakage_follows_a_frequency_switch_at_once():
    """The leakage held over a thermal step takes the new OPP's voltage when the switch lands,
    not at the next step (it had lagged by up to one step: 0.2-0.4 % of CPU energy)."""
    plant = Plant(TX2, governor="userspace", online=TX2.cpus)
    cl = plant.clusters["a57"]
    table = cl.table
    low = cl.freqs[0]
    plant.set_freq("a57", low)
    run_to(plant, 1.0)
    assert cl.k == 0
    before = cl.leak_core_w
    plant.set_freq("a57", cl.freqs[-1])
    t_switch = plant.t + cl.latency_s
    run_to(plant, t_switch + 1e-6)
    assert cl.k == len(cl.freqs) - 1
    assert plant._ticks * plant._dt < t_switch + plant._dt  # still inside the same thermal step
    assert cl.leak_core_w == pytest.approx(
        before * table.leak_ref_w[-1] / table.leak_ref_w[0], rel=1e-12
    )
