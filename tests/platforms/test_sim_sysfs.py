"""SimSysfs: the layout of platforms.paths, kernel-like write semantics, reads that track the plant;
SimProcessControl and make_sim_platform."""

from __future__ import annotations

import errno

import pytest

from platforms import paths
from platforms.dag import make_dag
from platforms.errors import SysfsUnavailable, SysfsWriteError
from platforms.procs import ProcessGone
from platforms.sim import SimJob, SimProcessControl, SimSysfs, make_sim_platform
from platforms.sim.plant import Plant
from platforms.spec import load_board

BOARDS = ["tx2", "orin-nx", "rubikpi3"]
TX2 = load_board("tx2")
P0 = paths.policy_dir(0)


def tasks(seconds: float, n: int, khz: int = 2035200):
    return make_dag("busy", [seconds * khz * 1e3] * n, [0.0] * n, [], [])


def fs_for(board="tx2", **kw) -> SimSysfs:
    return SimSysfs(Plant(load_board(board), **kw))


def write_err(fs, path, value) -> int:
    with pytest.raises(SysfsWriteError) as err:
        fs.write(path, value)
    assert err.value.path == path and err.value.value == value
    return err.value.errno


def settle(fs):
    """Let a frequency transition complete."""
    fs.plant.advance(fs.plant.t + 0.01)


# -- layout ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("board", BOARDS)
def test_layout_matches_paths_for_the_spec(board):
    spec = load_board(board)
    fs = fs_for(board)
    assert fs.list(paths.CPUFREQ) == sorted(f"policy{c.policy}" for c in spec.clusters)
    for cs in spec.clusters:
        assert set(paths.POLICY_FILES) <= set(fs.list(paths.policy_dir(cs.policy)))
        assert fs.read(paths.policy_file(cs.policy, "related_cpus")).split() == [
            str(c) for c in cs.cpus
        ]
        assert fs.read_ints(paths.policy_file(cs.policy, "scaling_available_frequencies")) == list(
            cs.freqs_khz
        )
        assert fs.read(paths.policy_file(cs.policy, "scaling_driver")) == cs.scaling_driver
        assert fs.read(paths.policy_file(cs.policy, "scaling_governor")) == cs.default_governor
        assert (
            fs.read_int(paths.policy_file(cs.policy, "cpuinfo_transition_latency"))
            == cs.transition_latency_ns
        )
    cpus = spec.cpus
    assert not fs.exists(paths.cpu_online(cpus[0]))  # cpu0: not hot-pluggable
    for cpu in cpus[1:]:
        assert fs.read(paths.cpu_online(cpu)) == (
            "0" if any(cpu in c.offline_by_default for c in spec.clusters) else "1"
        )
    assert fs.read(f"{paths.CPU}/possible") == paths.format_cpu_ranges(cpus)
    zones = fs.list(paths.THERMAL)
    assert zones == sorted(f"thermal_zone{i}" for i in range(len(spec.zones)))
    for i, z in enumerate(spec.zones):
        assert fs.read(paths.zone_file(i, "type")) == z.type
        for k, trip in enumerate(z.trips):
            assert fs.read_int(paths.zone_file(i, f"trip_point_{k}_temp")) == trip.temp_mc
            assert fs.read(paths.zone_file(i, f"trip_point_{k}_type")) == trip.type
        assert not fs.exists(paths.zone_file(i, f"trip_point_{len(z.trips)}_temp"))
    assert "\0" in fs.read(paths.DT_COMPATIBLE) or len(spec.compatible) == 1
    assert any(m in fs.read(paths.DT_MODEL) for m in spec.model)
    stat = fs.read(paths.PROC_STAT).splitlines()
    assert stat[0].startswith("cpu  ")
    assert not fs.exists("devices/system/cpu/cpufreq/policy99/scaling_cur_freq")
    with pytest.raises(SysfsUnavailable, match="no such file"):
        fs.read("devices/system/cpu/cpufreq/policy0/nope")
    with pytest.raises(SysfsUnavailable, match="directory"):
        fs.read(P0)


def test_thermal_quirks_are_reproduced():
    fs = fs_for("tx2")
    types = [z.type for z in TX2.zones]
    with pytest.raises(SysfsUnavailable, match="empty"):
        fs.read(paths.zone_file(types.index("PLL-therm"), "temp"))
    assert fs.read(paths.zone_file(types.index("PMIC-Die"), "temp")) == "100000"
    orin = fs_for("orin-nx")
    cv0 = [z.type for z in orin.spec.zones].index("cv0-thermal")
    with pytest.raises(SysfsUnavailable, match="EAGAIN"):
        orin.read(paths.zone_file(cv0, "temp"))


def test_iio_rails_on_tx2():
    fs = fs_for("tx2")
    for rail in TX2.rails:
        assert fs.read(paths.iio_rail_name(rail.device, rail.channel)) == rail.name
        mw = fs.read_int(paths.iio_power(rail.device, rail.channel))
        ma = fs.read_int(f"{rail.device}/in_current{rail.channel}_input")
        mv = fs.read_int(f"{rail.device}/in_voltage{rail.channel}_input")
        assert mw == pytest.approx(mv * ma / 1000, abs=mv / 1000)
    vdd_in = TX2.total_rail
    total_mw, cpu_mw = (x * 1000 for x in fs.plant.power_w())
    assert fs.read_int(paths.iio_power(vdd_in.device, vdd_in.channel)) == round(total_mw)
    cpu = TX2.cpu_rail
    assert fs.read_int(paths.iio_power(cpu.device, cpu.channel)) == round(cpu_mw)


def test_hwmon_rails_on_orin():
    spec = load_board("orin-nx")
    fs = fs_for("orin-nx")
    dev = spec.rails[0].device
    (hw,) = fs.list(paths.hwmon_root(dev))
    assert hw == "hwmon2"
    d = f"{paths.hwmon_root(dev)}/{hw}"
    assert fs.read(f"{d}/name") == "ina3221"
    power = fs.plant.rail_power_w()
    for rail in spec.rails:
        assert fs.read(f"{d}/in{rail.channel}_label") == rail.name
        mw = (
            fs.read_int(f"{d}/in{rail.channel}_input")
            * fs.read_int(f"{d}/curr{rail.channel}_input")
            / 1000
        )
        assert mw == pytest.approx(power[rail.name] * 1000, abs=5.0)


def test_rubikpi_has_no_rails():
    fs = fs_for("rubikpi3")
    assert not fs.exists("bus")


# -- governors and frequencies -------------------------------------------------------------------------


def test_governor_writes():
    fs = fs_for("tx2")
    gov = f"{P0}/scaling_governor"
    assert write_err(fs, gov, "turbo") == errno.EINVAL
    fs.write(gov, "schedutil\n")
    with pytest.raises(SysfsUnavailable, match="unsupported"):
        fs.read(f"{P0}/scaling_setspeed")
    assert write_err(fs, f"{P0}/scaling_setspeed", "960000") == errno.EINVAL
    fs.write(gov, "userspace")
    assert fs.read(gov) == "userspace"
    assert fs.read_int(f"{P0}/scaling_setspeed") == 2035200  # userspace starts at the current freq
    fs.write(f"{P0}/scaling_setspeed", "1000000")  # snaps to the entry at or below
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 960000 == fs.read_int(f"{P0}/scaling_setspeed")
    fs.write(gov, "ondemand")  # the other governors keep the current frequency
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 960000
    fs.write(gov, "powersave")
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 345600
    fs.write(gov, "performance")
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 2035200
    assert (
        fs.read(paths.policy_file(1, "scaling_governor")) == "schedutil"
    )  # other policy untouched


def test_modular_governor_is_refused_until_loaded():
    fs = fs_for("rubikpi3")
    assert "powersave" not in fs.read(f"{P0}/scaling_available_governors").split()
    assert write_err(fs, f"{P0}/scaling_governor", "powersave") == errno.EINVAL
    assert write_err(fs, f"{P0}/scaling_governor", "conservative") == errno.EINVAL


def test_performance_follows_max_limit_and_limits_are_validated():
    fs = fs_for("tx2", governor="performance")
    mx, mn = f"{P0}/scaling_max_freq", f"{P0}/scaling_min_freq"
    fs.write(mx, "1500000")  # not a table entry: a ceiling
    settle(fs)
    assert fs.read_int(mx) == 1500000
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 1420800
    fs.write(mn, "960000")
    assert write_err(fs, mx, "806400") == errno.EINVAL  # would leave min > max
    assert write_err(fs, mn, "1600000") == errno.EINVAL
    assert write_err(fs, mn, "fast") == errno.EINVAL
    assert fs.read_int(mx) == 1500000 and fs.read_int(mn) == 960000
    fs.write(mx, "99999999")  # clamps to cpuinfo_max_freq
    assert fs.read_int(mx) == 2035200
    fs.write(mn, "1")
    assert fs.read_int(mn) == 345600
    fs.write(f"{P0}/scaling_governor", "powersave")
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 345600
    fs.write(mn, "652800")  # powersave re-applies when the limits change
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 652800


def test_setspeed_is_held_within_limits():
    fs = fs_for("tx2", governor="userspace")
    fs.write(f"{P0}/scaling_max_freq", "1267200")
    fs.write(f"{P0}/scaling_setspeed", "2035200")
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 1267200
    fs.write(f"{P0}/scaling_min_freq", "806400")
    fs.write(f"{P0}/scaling_setspeed", "345600")
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == 806400
    assert write_err(fs, f"{P0}/scaling_setspeed", "-5") == errno.EINVAL


def test_read_only_and_missing_files():
    fs = fs_for("tx2")
    assert write_err(fs, f"{P0}/scaling_cur_freq", "960000") == errno.EACCES
    assert write_err(fs, f"{P0}/cpuinfo_max_freq", "960000") == errno.EACCES
    assert write_err(fs, paths.zone_file(0, "trip_point_0_temp"), "90000") == errno.EACCES
    assert write_err(fs, paths.cpu_online(0), "0") == errno.ENOENT
    assert write_err(fs, "devices/system/cpu/cpufreq/policy0/bogus", "1") == errno.ENOENT
    assert fs.writable(f"{P0}/scaling_setspeed") and not fs.writable(f"{P0}/scaling_cur_freq")


# -- hotplug ------------------------------------------------------------------------------------------


def test_cpu_online_writes():
    fs = fs_for("tx2")
    assert not fs.exists(paths.cpu_cpufreq(1))  # Denver offline by default
    with pytest.raises(SysfsUnavailable, match="empty"):  # no online CPU in the policy
        fs.read(paths.policy_file(1, "affected_cpus"))
    fs.write(paths.cpu_online(1), "1")
    assert fs.exists(f"{paths.cpu_cpufreq(1)}/scaling_cur_freq")
    assert fs.read(f"{paths.CPU}/online") == "0-1,3-5"
    assert fs.read(paths.policy_file(1, "affected_cpus")) == "1"
    fs.write(paths.cpu_online(4), "0")
    assert fs.read(paths.policy_file(0, "affected_cpus")) == "0 3 5"
    assert not fs.exists(paths.cpu_cpufreq(4)) and fs.list(paths.cpu_cpufreq(4)) == []
    assert "cpufreq" not in fs.list(f"{paths.CPU}/cpu4")
    assert fs.read(paths.cpu_online(4)) == "0"
    assert write_err(fs, paths.cpu_online(3), "2") == errno.EINVAL
    for cpu in (1, 3, 5):
        fs.write(paths.cpu_online(cpu), "0")
    assert fs.read(f"{paths.CPU}/online") == "0"
    # the policy's files stay readable through cpuN/cpufreq while online
    fs.write(paths.cpu_online(5), "1")
    assert fs.read(f"{paths.cpu_cpufreq(5)}/scaling_governor") == fs.read(f"{P0}/scaling_governor")


# -- reads follow the plant ----------------------------------------------------------------------------


def test_reads_track_the_plant():
    fs = fs_for("tx2", governor="userspace")
    plant = fs.plant
    idle_mw = fs.read_int(paths.iio_power(TX2.cpu_rail.device, TX2.cpu_rail.channel))
    pid = plant.submit(SimJob(tasks(2.0, 2), "two"))
    plant.set_affinity(pid, (0, 3))
    plant.advance(1.0)
    busy_mw = fs.read_int(paths.iio_power(TX2.cpu_rail.device, TX2.cpu_rail.channel))
    assert busy_mw > idle_mw + 800  # two A57 cores at 2 GHz
    temp = fs.read_int(paths.zone_file(0, "temp"))
    assert temp % 500 == 0 and temp == pytest.approx(plant.temps_c()["BCPU-therm"] * 1000, abs=250)
    stat = {
        ln.split()[0]: [int(x) for x in ln.split()[1:]]
        for ln in fs.read(paths.PROC_STAT).splitlines()
        if ln.startswith("cpu")
    }
    assert stat["cpu0"][0] == 100 and stat["cpu3"][0] == 100  # 1 s busy in USER_HZ
    assert stat["cpu4"][0] == 0 and stat["cpu4"][3] == 100  # 1 s idle
    assert "cpu1" not in stat  # offline CPUs are not listed
    assert stat["cpu"][0] == 200
    fs.write(f"{P0}/scaling_setspeed", "1017600")
    settle(fs)
    assert fs.read_int(f"{P0}/scaling_cur_freq") == plant.freq_khz("a57") == 960000


# -- process control and the platform ------------------------------------------------------------------


def test_sim_process_control():
    plant = Plant(TX2)
    procs = SimProcessControl(plant)
    pid = plant.submit(SimJob(tasks(0.5, 4), "p"))
    late = plant.submit(SimJob(tasks(0.1, 1), "late", release_t=5.0))
    assert procs.alive(pid) and not procs.alive(late) and not procs.alive(1)
    assert procs.get_affinity(pid) == TX2.cpus
    procs.set_affinity(pid, (0, 3))
    assert procs.get_affinity(pid) == (0, 3)
    procs.set_priority(pid, rt_priority=20)
    assert plant.jobs[pid].rt_priority == 20
    with pytest.raises(ValueError):
        procs.set_priority(pid, rt_priority=120)
    with pytest.raises(ValueError):
        procs.set_affinity(pid, ())
    plant.advance(0.25)
    assert procs.cpu_time(pid) == pytest.approx(0.5, rel=1e-6)  # two cores for 0.25 s
    plant.advance(10.0)
    assert not procs.alive(pid)
    for call in (
        lambda: procs.cpu_time(pid),
        lambda: procs.set_affinity(pid, (0,)),
        lambda: procs.get_affinity(99),
    ):
        with pytest.raises(ProcessGone):
            call()


def test_make_sim_platform_clock_stops_at_job_events():
    plat = make_sim_platform("tx2", seed=3)
    assert plat.kind == "sim" and plat.sysfs.kind == "sim" and plat.spec.name == "tx2"
    plant = plat.sysfs.plant
    assert plat.procs.plant is plant
    pid = plant.submit(SimJob(tasks(0.05, 4), "short"))
    plat.clock.sleep(1.0)
    assert plat.clock.now() == pytest.approx(plant.jobs[pid].finish_t) == plant.t
    plat.clock.sleep(1.0)
    assert plat.clock.now() == pytest.approx(plant.t) and plant.t > 1.0
    assert make_sim_platform(load_board("orin-nx")).spec.name == "orin-nx"


@pytest.mark.parametrize("board", BOARDS)
def test_sensor_reads_an_observation_from_simsysfs(board):
    sense = pytest.importorskip("platforms.sense")
    spec = load_board(board)
    plant = Plant(spec)
    plant.submit(SimJob(tasks(1.0, spec.ncpus), "load"))
    plant.advance(0.5)
    obs = sense.Sensor(spec, SimSysfs(plant)).read(plant.t)
    assert obs.board == spec.name
    assert [c.name for c in obs.clusters] == [c.name for c in spec.clusters]
    for c in obs.clusters:
        assert c.online == tuple(cpu for cpu in c.cpus if plant.is_online(cpu))
        if c.online:
            assert c.cur_khz == plant.freq_khz(c.name)
            assert c.governor == plant.clusters[c.name].governor
    temps = plant.temps_c()
    for z in obs.zones:
        if z.type in temps and z.temp_c is not None:
            assert z.temp_c == pytest.approx(temps[z.type], abs=0.6)
    if spec.total_rail:
        assert obs.total_power_w == pytest.approx(plant.power_w()[0], abs=0.01)
