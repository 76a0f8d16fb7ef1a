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
