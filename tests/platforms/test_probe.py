"""Board detection and discovery: a fake tree of a shipped board probes back to its spec."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from platforms import cpufreq, paths
from platforms.faketree import write_fake_tree
from platforms.probe import detect_board, format_probe, probe, spec_to_dict
from platforms.spec import board_names, load_board, parse_board
from platforms.sysfs import DirSysfs
from platforms.thermal import guess_zone_role

BOARDS = ["tx2", "orin-nx", "rubikpi3"]


def _assert_round_trip(spec, found):
    assert [c.name for c in found.clusters] == [c.name for c in spec.clusters]
    for want, got in zip(spec.clusters, found.clusters, strict=True):
        assert got.policy == want.policy
        assert got.cpus == want.cpus
        assert got.freqs_khz == want.freqs_khz
        assert got.governors == want.governors  # modular ones are not in the spec list
        assert got.modular_governors == want.modular_governors
        assert got.default_governor == want.default_governor
        assert got.scaling_driver == want.scaling_driver
        assert got.transition_latency_ns == want.transition_latency_ns
        assert got.core_type == want.core_type and got.capacity == want.capacity
    assert [(z.type, z.trips) for z in found.zones] == [(z.type, z.trips) for z in spec.zones]
    assert [(r.name, r.role) for r in found.rails] == [(r.name, r.role) for r in spec.rails]
    assert [(r.driver, r.device, r.channel) for r in found.rails] == [
        (r.driver, r.device, r.channel) for r in spec.rails
    ]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """One read-only fake tree per shipped board, shared by the tests that only read."""
    trees: dict[str, DirSysfs] = {}

    def get(board: str) -> DirSysfs:
        if board not in trees:
            root = tmp_path_factory.mktemp(board)
            write_fake_tree(load_board(board), root, seed=3)
            trees[board] = DirSysfs(root)
        return trees[board]

    return get


@pytest.mark.parametrize("board", BOARDS)
def test_probe_round_trips_a_shipped_board(board, shipped):
    spec = load_board(board)
    result = probe(shipped(board))
    assert result.board == board
    _assert_round_trip(spec, result.spec)
    assert result.online == spec.cpus
    for p in (c.policy for c in spec.clusters):
        assert set(result.writable[p]) == set(cpufreq.WRITABLE_FILES)
        assert all(result.writable[p].values())  # mode 0644 files of a tree we own


@pytest.mark.parametrize("board", BOARDS)
def test_probe_json_loads_back_as_a_spec(board, shipped):
    spec = load_board(board)
    d = json.loads(json.dumps(probe(shipped(board)).to_dict()))
    again = parse_board(d["spec"], "probe.json")
    _assert_round_trip(spec, again)
    assert d["board"] == board
    assert set(d["writable"]) == {f"policy{c.policy}" for c in spec.clusters}


@pytest.mark.parametrize("board", BOARDS)
def test_detection(board, shipped):
    assert detect_board(shipped(board)) == board


def _write_dt(tmp_path, compatible: list[str] | None, model: str | None):
    dt = tmp_path / "proc/device-tree"
    dt.mkdir(parents=True, exist_ok=True)
    if compatible is not None:
        (dt / "compatible").write_bytes(("\0".join(compatible) + "\0").encode())
    if model is not None:
        (dt / "model").write_bytes((model + "\0").encode())
    return DirSysfs(tmp_path)


@pytest.mark.parametrize(
    "compatible, model, board",
    [
        (["nvidia,quill", "nvidia,tegra186"], "quill", "tx2"),
        (["nvidia,p3636-0001", "nvidia,tegra186"], None, "tx2"),
        (
            ["nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"],
            "NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
            "orin-nx",
        ),
        (["nvidia,p3767-0001", "nvidia,tegra234"], None, "orin-nx"),
        (["qcom,qcm6490-rb3gen2", "qcom,qcm6490"], "Thundercomm, Inc. RUBIK Pi 3", "rubikpi3"),
        # a SoC compatible alone is any QCM6490/QCS6490 board: the model must confirm it
        (["qcom,qcs6490"], None, None),
        (["thundercomm,rubikpi3", "qcom,qcs6490"], None, "rubikpi3"),
        (["fairphone,fp5", "qcom,qcm6490"], "Fairphone 5", None),
        (
            ["qcom,qcs6490-rb3gen2", "qcom,qcs6490"],
            "Qualcomm Technologies, Inc. Robotics RB3gen2",
            None,
        ),
        (["qcom,qcm6490-rb3gen2", "qcom,qcm6490"], "Qualcomm Technologies, Inc. RB3gen2", None),
        (None, "Thundercomm RUBIK Pi 3", "rubikpi3"),  # model alone still detects
        (["raspberrypi,5-model-b", "brcm,bcm2712"], "Raspberry Pi 5 Model B", None),
        (None, None, None),
    ],
)
def test_detection_rules(tmp_path, compatible, model, board):
    assert detect_board(_write_dt(tmp_path, compatible, model)) == board


def test_compatible_outranks_model(tmp_path):
    s = _write_dt(tmp_path, ["nvidia,tegra186"], "Jetson Orin NX")
    assert detect_board(s) == "tx2"


def test_compatible_entries_match_whole_not_as_substrings(tmp_path):
    s = _write_dt(tmp_path, ["nvidia,tegra1860"], None)
    assert detect_board(s) is None


def test_unknown_board_is_described_by_discovery(tmp_path):
    base = load_board("orin-nx")
    stranger = dataclasses.replace(
        base, name="mystery", compatible=("acme,widget",), model=("Widget",)
    )
    write_fake_tree(stranger, tmp_path)
    result = probe(DirSysfs(tmp_path))
    assert result.board is None
    spec = result.spec
    assert spec.name == "unknown" and spec.compatible == ("acme,widget",)
    assert [c.name for c in spec.clusters] == ["policy0", "policy4"]
    assert [c.cpus for c in spec.clusters] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    for c in spec.clusters:
        assert c.core_type == "unknown" and c.capacity == 1.0
        assert c.freqs_khz == base.clusters[0].freqs_khz
        assert c.governors == base.clusters[0].governors
        assert c.scaling_driver == "tegra194-cpufreq"
    assert [z.type for z in spec.zones] == [z.type for z in base.zones]
    assert spec.zone("cpu-thermal").role == "cpu" and spec.zone("gpu-thermal").role == "gpu"
    assert spec.zone("cv0-thermal").quirk == "eagain"  # a gated sensor, found by reading
    assert [(r.name, r.role) for r in spec.rails] == [
        ("VDD_IN", "total"),
        ("VDD_CPU_GPU_CV", "cpu"),
        ("VDD_SOC", "sub"),
    ]
    text = format_probe(result)
    assert "unknown" in text and "policy4" in text and "VDD_IN" in text


def test_unknown_board_zone_quirks_and_roles_by_reading(tmp_path):
    base = load_board("tx2")
    stranger = dataclasses.replace(
        base, name="x", compatible=("acme,q9",), model=("Acme Q9 board",), title="Acme Q9"
    )
    write_fake_tree(stranger, tmp_path)
    spec = probe(DirSysfs(tmp_path)).spec
    assert spec.zone("PLL-therm").quirk == "blank"
    assert spec.zone("PMIC-Die").quirk == "stuck100" and spec.zone("PMIC-Die").role == "ignore"
    assert spec.zone("BCPU-therm").role == "cpu"
    assert spec.zone("Tboard_tegra").role == "board"


@pytest.mark.parametrize(
    "zone_type, role",
    [
        ("cpu-thermal", "cpu"),
        ("GPU-therm", "gpu"),
        ("soc1-thermal", "soc"),
        ("pm7250b-bcl-lvl0", "ignore"),
        ("PMIC-Die", "ignore"),
        ("sdm-skin-thermal", "board"),
        ("mystery", "other"),
        # CPU package and core-cluster sensors without "cpu" in the name (x86, RK3588)
        ("x86_pkg_temp", "cpu"),
        ("bigcore0-thermal", "cpu"),
        ("bigcore1-thermal", "cpu"),
        ("littlecore-thermal", "cpu"),
        ("package-thermal", "cpu"),
        ("coretemp", "cpu"),
        ("acpitz", "other"),
        ("npu-thermal", "other"),
        ("gpu-package", "gpu"),
        ("soc-thermal", "soc"),
    ],
)
def test_guess_zone_role(zone_type, role):
    assert guess_zone_role(zone_type) == role


def test_default_mode_tx2_keeps_the_offline_cluster_from_the_spec(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path, mode="default")
    result = probe(DirSysfs(tmp_path))
    assert result.online == (0, 3, 4, 5)
    assert sorted(result.policies) == [0]  # only policy0 is live
    assert [c.name for c in result.spec.clusters] == ["a57", "denver"]
    assert any("policy1 (denver) absent" in n for n in result.notes)
    assert 1 not in result.writable


def test_default_mode_unknown_board_reports_orphan_cpus(tmp_path):
    base = load_board("tx2")
    stranger = dataclasses.replace(
        base, name="x", compatible=("acme,q9",), model=("Acme Q9 board",), title="Acme Q9"
    )
    write_fake_tree(stranger, tmp_path, mode="default")
    result = probe(DirSysfs(tmp_path))
    assert [c.policy for c in result.spec.clusters] == [0]
    assert any("[1, 2]" in n and "no cpufreq policy" in n for n in result.notes)


def test_rubik_probe_notes_missing_power_monitor(shipped):
    result = probe(shipped("rubikpi3"))
    assert result.spec.rails == ()
    assert any("energy is unavailable" in n for n in result.notes)
    assert result.spec.cluster("gold").modular_governors == ("powersave", "conservative")


def test_empty_tree_probes_without_crashing(tmp_path):
    result = probe(DirSysfs(tmp_path))
    assert result.board is None and result.spec.clusters == ()
    assert any("no cpufreq policy" in n for n in result.notes)
    assert "board: unknown" in format_probe(result)


def test_read_only_policy_files_are_reported(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path)

    class ReadOnly(DirSysfs):
        def writable(self, path):
            return not path.endswith("scaling_setspeed")

    result = probe(ReadOnly(tmp_path))
    assert result.writable[0]["scaling_setspeed"] is False
    assert result.writable[0]["scaling_governor"] is True
    assert "not scaling_setspeed" in format_probe(result)


def test_every_shipped_board_is_covered():
    assert sorted(BOARDS) == board_names()


def test_descending_frequency_table_is_sorted(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path)
    f = tmp_path / paths.policy_file(0, "scaling_available_frequencies")
    f.chmod(0o644)
    f.write_text(" ".join(map(str, reversed(spec.clusters[0].freqs_khz))) + "\n")
    assert probe(DirSysfs(tmp_path)).spec.clusters[0].freqs_khz == spec.clusters[0].freqs_khz


# -- fake tree fidelity (daemons.md section 11.6) --------------------------------------------


def test_fake_tree_fidelity(tmp_path):
    spec = load_board("tx2")
    write_fake_tree(spec, tmp_path, mode="default")
    cpu = tmp_path / paths.CPU
    assert (cpu / "online").read_text() == "0,3-5\n"
    assert (cpu / "present").read_text() == "0-5\n"
    assert not (cpu / "cpu0/online").exists() and (cpu / "cpu1/online").read_text() == "0\n"
    pol = tmp_path / paths.policy_dir(0)
    assert (pol / "related_cpus").read_text() == "0 3 4 5\n"
    assert (pol / "scaling_setspeed").read_text() == "<unsupported>\n"
    for name in paths.POLICY_FILES:
        assert (pol / name).read_text().endswith("\n")
    assert (pol / "scaling_cur_freq").stat().st_mode & 0o777 == 0o444
    assert (pol / "scaling_max_freq").stat().st_mode & 0o777 == 0o644
    assert (pol / "cpuinfo_cur_freq").stat().st_mode & 0o777 == 0o400
    assert os.path.islink(cpu / "cpu3/cpufreq") and os.path.samefile(cpu / "cpu3/cpufreq", pol)
    assert not os.path.lexists(cpu / "cpu1/cpufreq")
    assert not (tmp_path / paths.policy_dir(1)).exists()
    compat = (tmp_path / paths.DT_COMPATIBLE).read_bytes()
    assert compat.endswith(b"\0") and b"nvidia,tegra186" in compat.split(b"\0")
    stat = (tmp_path / paths.PROC_STAT).read_text().splitlines()
    assert [ln.split()[0] for ln in stat[:5]] == ["cpu", "cpu0", "cpu3", "cpu4", "cpu5"]


def test_fake_tree_modular_governors_absent_and_quirks_toggle(tmp_path):
    rubik = load_board("rubikpi3")
    write_fake_tree(rubik, tmp_path / "a")
    avail = (tmp_path / "a" / paths.policy_file(4, "scaling_available_governors")).read_text()
    assert "powersave" not in avail and "conservative" not in avail and "userspace" in avail
    write_fake_tree(load_board("tx2"), tmp_path / "b", quirks=False)
    s = DirSysfs(tmp_path / "b")
    assert s.read(paths.zone_file(6, "type")) == "PMIC-Die"
    assert s.read_int(paths.zone_file(6, "temp")) != 100000
    assert s.read(paths.zone_file(3, "temp"))  # PLL not blank without quirks


def test_fake_tree_refuses_foreign_folders_and_rewrites_its_own(tmp_path):
    spec = load_board("tx2")
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a hidvfs fake tree"):
        write_fake_tree(spec, tmp_path)
    with pytest.raises(ValueError, match="mode"):
        write_fake_tree(spec, tmp_path / "t", mode="maxn")
    write_fake_tree(spec, tmp_path / "t", mode="default")
    write_fake_tree(spec, tmp_path / "t", mode="all-online")  # rewrite in place
    assert cpufreq.list_policies(DirSysfs(tmp_path / "t")) == [0, 1]


def test_fake_writer_settle_emulates_the_kernel(tmp_path):
    spec = load_board("tx2")
    w = write_fake_tree(spec, tmp_path)
    s = DirSysfs(tmp_path)
    cpufreq.set_governor(s, 0, "userspace")
    w.settle()
    assert s.read_int(paths.policy_file(0, "scaling_setspeed")) == s.read_int(
        paths.policy_file(0, "scaling_cur_freq")
    )
    cpufreq.set_setspeed(s, 0, 1113600)
    w.settle()
    assert s.read_int(paths.policy_file(0, "scaling_cur_freq")) == 1113600
    cpufreq.set_limits(s, 0, 345600, 1200000)  # a cap between OPPs acts as a ceiling
    cpufreq.set_setspeed(s, 0, 2035200)
    w.settle()
    assert s.read_int(paths.policy_file(0, "scaling_cur_freq")) == 1113600
    cpufreq.set_governor(s, 0, "performance")
    w.settle()
    assert (tmp_path / paths.policy_file(0, "scaling_setspeed")).read_text() == "<unsupported>\n"
    assert s.read_int(paths.policy_file(0, "scaling_cur_freq")) == 1113600


def test_fake_writer_hotplug_recreates_policy(tmp_path):
    spec = load_board("tx2")
    w = write_fake_tree(spec, tmp_path, mode="default")
    s = DirSysfs(tmp_path)
    w.set_cpu_online(2, True)
    assert cpufreq.list_policies(s) == [0, 1]
    st = cpufreq.read_policy(s, 1)
    assert st.related_cpus == (1, 2) and st.affected_cpus == (2,)
    assert cpufreq.online_cpus(s) == (0, 2, 3, 4, 5)
    assert "cpu2 " in (tmp_path / paths.PROC_STAT).read_text()
    with pytest.raises(ValueError, match="cpu0"):
        w.set_cpu_online(0, False)


def test_online_cpus_without_cpufreq_are_not_called_offline_nor_given_the_spec(tmp_path):
    """Only CPUs that really are offline borrow their cluster from the spec (TX2 Denver in
    the default nvpmodel mode); online CPUs without a policy are a missing driver."""
    import shutil

    write_fake_tree(load_board("tx2"), tmp_path)
    shutil.rmtree(tmp_path / "devices/system/cpu/cpufreq/policy1")
    for c in (1, 2):
        shutil.rmtree(tmp_path / f"devices/system/cpu/cpu{c}/cpufreq", ignore_errors=True)
    res = probe(DirSysfs(tmp_path))
    assert [c.name for c in res.spec.clusters] == ["a57"]
    text = "\n".join(res.notes)
    assert "CPUs [1, 2] are online: no cpufreq policy" in text
    assert "offline; taken from" not in text


def test_a_policy_file_that_does_not_parse_is_a_note(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path)
    (tmp_path / "devices/system/cpu/cpufreq/policy0/scaling_available_frequencies").write_text(
        "a b c\n"
    )
    res = probe(DirSysfs(tmp_path))
    assert any("policy0/scaling_available_frequencies" in n and "a b c" in n for n in res.notes)


@pytest.mark.parametrize("text", ["0-5,7-99999999", "3-1", "-1"])
def test_a_garbage_cpu_range_is_refused_not_expanded(text):
    with pytest.raises(ValueError):
        paths.parse_cpu_ranges(text)


def test_a_cpu_list_in_both_kernel_forms_parses():
    assert paths.parse_cpu_ranges("0-3,5") == (0, 1, 2, 3, 5)
    assert paths.parse_cpu_ranges("0 3 4 5\n") == (0, 3, 4, 5)
    assert paths.parse_cpu_ranges("") == ()


def test_unknown_board_cpu_zones_watch_every_cluster_and_the_guard_caps_them(tmp_path):
    """Which cores a zone sits by is not in sysfs: an unknown board's CPU zones are linked
    to every cluster, so the thermal guard acts on them (linked to none it never did)."""
    from agents.policy import Decision
    from daemon.guard import ThermalGuard
    from platforms.sense import Sensor

    base = load_board("rubikpi3")
    stranger = dataclasses.replace(
        base, name="x", compatible=("acme,r9",), model=("Acme R9",), title="Acme R9"
    )
    write_fake_tree(stranger, tmp_path)
    for i, z in enumerate(base.zones):
        if z.role == "cpu":
            (tmp_path / paths.zone_file(i, "temp")).write_text("108000\n")
    sysfs = DirSysfs(tmp_path)
    result = probe(sysfs)
    assert result.board is None
    names = tuple(c.name for c in result.spec.clusters)
    cpu_zones = [z for z in result.spec.zones if z.role == "cpu"]
    assert cpu_zones and all(z.clusters == names for z in cpu_zones)
    assert all(z.clusters == () for z in result.spec.zones if z.role != "cpu")
    sensor, guard = Sensor(result.spec, sysfs), ThermalGuard()
    for t in range(10):
        obs = sensor.read(float(t))
        top = Decision(freq_khz={c.name: c.freqs_khz[-1] for c in obs.clusters})
        out = guard.apply(top, obs)
    assert all(out.freq_khz[c.name] < c.freqs_khz[-1] for c in obs.clusters)


def test_probe_matches_the_other_bsp_names_through_the_aliases(tmp_path):
    """A downstream RUBIK Pi zone takes the role and the cluster of the spec zone it is an
    alias of (a zone the spec does not know would watch every cluster), under its own type."""
    spec = load_board("rubikpi3")
    w = write_fake_tree(spec, tmp_path)
    for i, z in enumerate(spec.zones):
        if z.type in ("cpu4-thermal", "cpuss0-thermal"):
            w.put(paths.zone_file(i, "type"), z.aliases[0], 0o444)
    found = probe(DirSysfs(tmp_path)).spec
    assert found.zone("cpu-1-0-usr").role == "cpu"
    assert found.zone("cpu-1-0-usr").clusters == ("gold",)
    assert found.zone("cpuss-0-usr").role == "soc"
    assert all(not z.aliases for z in found.zones)


@pytest.mark.parametrize("board", BOARDS)
def test_spec_to_dict_keeps_the_aliases(board):
    spec = load_board(board)
    again = parse_board(json.loads(json.dumps(spec_to_dict(spec))), "dumped.json")
    assert again.zones == spec.zones


def test_unreadable_live_values_read_unknown_not_none(tmp_path):
    """`hidvfs probe` is read by a person: an unreadable value is "unknown" (a note says why),
    never Python's None; the JSON keeps null."""
    from click.testing import CliRunner

    from tools.cli import cli

    write_fake_tree(load_board("tx2"), tmp_path)
    p0 = tmp_path / "devices/system/cpu/cpufreq/policy0"
    (p0 / "scaling_cur_freq").write_text("abc\n")
    (p0 / "scaling_min_freq").unlink()
    (p0 / "scaling_max_freq").unlink()
    (p0 / "scaling_governor").write_text("")
    (tmp_path / "devices/system/cpu/cpufreq/policy1/scaling_max_freq").write_text("x\n")
    text = format_probe(probe(DirSysfs(tmp_path)))
    assert "None" not in text, text
    assert "governor unknown, cur unknown, limits unknown;" in text
    assert "governor schedutil, cur 1267200 kHz, limits 345600-unknown;" in text
    assert "policy0/scaling_cur_freq: unavailable (not an integer: 'abc')" in text

    r = CliRunner().invoke(cli, ["probe", "--sysfs-root", str(tmp_path)])
    assert r.exit_code == 0 and "None" not in r.output and "cur unknown" in r.output, r.output
    r = CliRunner().invoke(cli, ["probe", "--sysfs-root", str(tmp_path), "--json"])
    live = json.loads(r.output)["policies"]
    assert live["policy0"] == {
        "governor": None,
        "cur_khz": None,
        "min_khz": None,
        "max_khz": None,
        "affected_cpus": [0, 3, 4, 5],
    }
    assert live["policy1"]["max_khz"] is None and live["policy1"]["min_khz"] == 345600


# -- boards hidvfs ships no spec for: x86 and RK3588 names, table-less drivers --------------


def _stranger(tmp_path, zones, *, base="tx2", table=True, **cluster):
    """A fake tree of an unknown board: ``base``'s CPUs under other names, ``zones`` as
    (type, temp °C, passive trip °C or None); ``cluster`` replaces fields of every cluster,
    and ``table=False`` removes the frequency tables (intel_pstate, amd-pstate, cppc)."""
    from platforms.spec import Trip, ZoneSpec

    spec = load_board(base)
    spec = dataclasses.replace(
        spec,
        name="x",
        compatible=("acme,x1",),
        model=("Acme X1",),
        title="Acme X1",
        clusters=tuple(dataclasses.replace(c, **cluster) for c in spec.clusters),
        zones=tuple(
            ZoneSpec(t, "other", trips=(Trip(trip * 1000, "passive", 2000),) if trip else ())
            for t, _, trip in zones
        ),
        rails=(),
    )
    writer = write_fake_tree(spec, tmp_path)
    for t, temp, _ in zones:
        writer.set_temp(t, temp)
    if not table:
        for c in spec.clusters:
            (tmp_path / paths.policy_file(c.policy, "scaling_available_frequencies")).unlink()
    return spec, DirSysfs(tmp_path)


@pytest.mark.parametrize(
    "zones",
    [
        [("acpitz", 28.0, None), ("INT3400 Thermal", 20.0, None), ("x86_pkg_temp", 99.5, 100)],
        [
            ("soc-thermal", 45.0, 85),
            ("bigcore0-thermal", 84.5, 85),
            ("bigcore1-thermal", 46.0, 85),
            ("littlecore-thermal", 44.0, 85),
            ("gpu-thermal", 40.0, 85),
        ],
    ],
    ids=["x86", "rk3588"],
)
def test_x86_and_rk3588_cpu_zones_are_cpu_zones_and_the_guard_caps_on_them(tmp_path, zones):
    """x86_pkg_temp and RK3588's bigcore/littlecore zones read as "other" left the thermal
    guard off without a word: a zone 0.5 °C below its trip never capped anything."""
    from agents.policy import Decision
    from daemon.guard import ThermalGuard
    from platforms.sense import Sensor

    _, sysfs = _stranger(tmp_path, zones)
    result = probe(sysfs)
    roles = {z.type: z.role for z in result.spec.zones}
    hot = next(t for t, temp, trip in zones if trip and temp > trip - 1)
    assert roles[hot] == "cpu"
    assert roles.get("gpu-thermal", "gpu") == "gpu" and roles.get("soc-thermal", "soc") == "soc"
    assert roles.get("acpitz", "other") == "other"
    assert not any("no thermal zone is classified" in n for n in result.notes)
    sensor, guard = Sensor(result.spec, sysfs), ThermalGuard()
    for t in range(5):
        obs = sensor.read(float(t))
        top = Decision(freq_khz={c.name: c.freqs_khz[-1] for c in obs.clusters})
        out = guard.apply(top, obs)
    assert obs.max_cpu_temp_c == pytest.approx(max(temp for _, temp, _ in zones))
    assert all(out.freq_khz[c.name] < c.freqs_khz[-1] for c in obs.clusters)


def test_no_cpu_zone_is_said_by_probe_and_by_the_daemon_warning_naming_the_zones(tmp_path, caplog):
    """Zones that read fine but none of them a CPU zone: "no CPU thermal zone can be read"
    sent the user after a sensor that works; the true reason is that none is a CPU zone."""
    import logging

    from daemon.logs import SensorErrorLog
    from platforms.sense import Sensor

    _, sysfs = _stranger(tmp_path, [("acpitz", 28.0, None), ("mystery", 50.0, 100)])
    result = probe(sysfs)
    said = [n for n in result.notes if n.startswith("no thermal zone is classified")]
    assert said and "acpitz (other), mystery (other)" in said[0], result.notes
    assert said[0] in format_probe(result)
    obs = Sensor(result.spec, sysfs).read(0.0)
    assert obs.max_cpu_temp_c is None and obs.errors == ()
    logger = logging.getLogger("probe-test.no-cpu-zone")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        SensorErrorLog(logger).update(obs.errors, cpu_temp=False)
        SensorErrorLog(logger, zones=result.spec.zones).update(obs.errors, cpu_temp=False)
    warned = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert len(warned) == 2 and all("event=no_cpu_temperature" in m for m in warned)
    assert not any("can be read" in m for m in warned), warned
    assert all("no thermal zone is classified as a CPU zone" in m for m in warned)
    assert "zones: acpitz (other), mystery (other)" in warned[1]


def test_an_unreadable_cpu_zone_is_still_said_to_be_unreadable(tmp_path, caplog):
    import logging

    from daemon.logs import SensorErrorLog
    from platforms.sense import Sensor

    _, sysfs = _stranger(tmp_path, [("acpitz", 28.0, None), ("x86_pkg_temp", 50.0, 100)])
    spec = probe(sysfs).spec
    (tmp_path / paths.zone_file(1, "temp")).write_text("\n")
    obs = Sensor(spec, sysfs).read(0.0)
    logger = logging.getLogger("probe-test.unreadable-cpu-zone")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        SensorErrorLog(logger).update(obs.errors, cpu_temp=False)
        SensorErrorLog(logger, zones=spec.zones).update(obs.errors, cpu_temp=False)
    warned = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert sum("no CPU thermal zone can be read" in m for m in warned) == 2, warned


_X86 = {
    "scaling_driver": "intel_pstate",
    "freqs_khz": (400000, 4700000),
    "governors": ("performance", "powersave"),
    "modular_governors": (),
    "default_governor": "powersave",
}
_X86_ZONES = [("x86_pkg_temp", 50.0, 100)]


def test_a_table_less_driver_is_probed_as_a_synthesized_100mhz_grid(tmp_path):
    """Without scaling_available_frequencies the table was {min, max}: every target floored
    to one of the two. Probe says the grid is synthesized, in text and JSON."""
    from click.testing import CliRunner

    from tools.cli import cli

    spec, sysfs = _stranger(tmp_path, _X86_ZONES, table=False, **_X86)
    result = probe(sysfs)
    grid = tuple(range(400000, 4700001, 100000))
    assert all(c.freqs_khz == grid for c in result.spec.clusters)
    note = (
        "policy0: no frequency table (driver intel_pstate): a 100 MHz grid from 400 to 4700 MHz"
        " (44 OPPs)"
    )
    assert note in result.notes
    assert not any(
        n.endswith("scaling_available_frequencies: unavailable (no such file)")
        for n in result.notes
    )
    text = format_probe(result)
    assert "44 synthesized OPPs 400-4700 MHz, driver intel_pstate" in text and note in text
    r = CliRunner().invoke(cli, ["probe", "--sysfs-root", str(tmp_path), "--json"])
    data = json.loads(r.output)
    assert note in data["notes"]
    assert parse_board(data["spec"], "probed.json").clusters[0].freqs_khz == grid


def test_a_table_less_policy_under_a_cap_pins_the_cap_and_its_limits_come_back_exactly(
    tmp_path,
):
    """An operator cap of 2.05 GHz made maxfreq pin the minimum (400 MHz, the grid floor of
    {min, max}); on the grid it pins 2.0 GHz, and the stop gives back the off-grid limits as
    they were read, not snapped to the grid."""
    import logging

    from agents.governors import make_governor
    from daemon.loop import ControlLoop
    from daemon.restore import restore_snapshot, take_snapshot
    from platforms.clock import VirtualClock
    from platforms.platform import Platform
    from platforms.procs import NoProcesses

    _, sysfs = _stranger(tmp_path, _X86_ZONES, table=False, **_X86)
    spec = probe(sysfs).spec
    for name, khz in (("scaling_min_freq", "412345"), ("scaling_max_freq", "2050000")):
        sysfs.write(paths.policy_file(0, name), khz)
    snapshot = take_snapshot(sysfs, spec)
    clock = VirtualClock(0.0)
    lp = ControlLoop(
        Platform(spec, sysfs, NoProcesses(), clock, kind="fake"),
        make_governor("maxfreq"),
        period_s=0.1,
    )
    for _ in range(3):
        lp.tick()
        clock.set(clock.now() + 0.1)
    assert cpufreq.read_limits(sysfs, 0) == (2000000, 2000000)
    assert restore_snapshot(sysfs, snapshot, logging.getLogger("probe-test.grid")).ok
    assert cpufreq.read_limits(sysfs, 0) == (412345, 2050000)


def test_probe_flags_the_zone_readings_the_daemon_refuses(tmp_path, monkeypatch):
    """EIO was shown as [eagain], and a reading in °C (52) passed without a word while the
    daemon refused it: probe now says both as the daemon does."""
    import errno

    from platforms import thermal
    from platforms.faketree import inject_read_error

    _, sysfs = _stranger(
        tmp_path,
        [("cpu-thermal", 50.0, 100), ("gpu-thermal", 40.0, 100), ("soc-thermal", 40.0, 100)],
    )
    inject_read_error(monkeypatch, sysfs, paths.zone_file(0, "temp"), errno.EIO)
    (tmp_path / paths.zone_file(1, "temp")).write_text("52\n")
    (tmp_path / paths.zone_file(2, "temp")).write_text("\n")
    result = probe(sysfs)
    assert [z.quirk for z in result.spec.zones] == [None, None, "blank"]
    text = format_probe(result)
    assert "100 passive [EIO]" in text and "[eagain]" not in text
    for i, z in enumerate(result.spec.zones[:2]):
        why = thermal.read_temp_c(sysfs, paths.zone_file(i, "temp"))[1]  # as the daemon says
        assert f"thermal zone {z.type}: {why}; the daemon refuses such a reading" in result.notes
    assert "likely °C" in text and "read failed: EIO" in text
    again = parse_board(json.loads(json.dumps(result.to_dict()))["spec"], "probed.json")
    assert again.zones == result.spec.zones


def test_probe_says_board_energy_is_unavailable_when_no_rail_is_the_input(tmp_path):
    from platforms.spec import RailSpec

    spec = load_board("orin-nx")
    rails = tuple(
        RailSpec(name, role, r.driver, r.device, r.channel, r.unit)
        for r, (name, role) in zip(
            spec.rails,
            [("VDD_GPU_SOC", "sub"), ("VDD_CPU_CV", "cpu"), ("VIN_SYS_5V0", "sub")],
            strict=True,
        )
    )
    stranger = dataclasses.replace(
        spec, name="x", compatible=("acme,r1",), model=("Acme R1",), title="Acme R1", rails=rails
    )
    write_fake_tree(stranger, tmp_path)
    result = probe(DirSysfs(tmp_path))
    assert [r.role for r in result.spec.rails] == ["sub", "cpu", "sub"]
    said = [n for n in result.notes if "board (total) energy is unavailable" in n]
    assert said and said[0].endswith("CPU energy is read from VDD_CPU_CV"), result.notes
    assert said[0] in format_probe(result)
