"""Defects an audit reproduced in the platform layer: a rail that cannot be read integrated as
0 J (or a silent undercount), a spec's rail ``unit`` ignored, every QCM6490/QCS6490 board
detected as a RUBIK Pi 3, ``POM_5V_IN`` not taken as the total rail, and ``trace info``
showing battery currents and a stuck PMIC as °C."""

from __future__ import annotations

import copy
import dataclasses
import json
import time

import pytest

from platforms import paths
from platforms.errors import SpecError
from platforms.faketree import write_fake_tree
from platforms.power import find_rail, guess_role, is_total_label, read_power_mw
from platforms.probe import detect_board, probe
from platforms.sampler import RailSampler
from platforms.spec import BOARDS_DIR, RailSpec, load_board, parse_board
from platforms.sysfs import DirSysfs
from platforms.trace import format_info, read_trace, trace_info
from platforms.yamlfile import load_yaml

# -- 1. energy when the total rail cannot be read ---------------------------------------------


@pytest.fixture
def orin(tmp_path):
    spec = load_board("orin-nx")
    writer = write_fake_tree(spec, tmp_path / "tree")
    writer.set_power("VDD_IN", 5000.0)
    return spec, writer


def _blank_total(writer) -> None:
    folder = writer._hwmon_folder(writer._rail("VDD_IN"))
    writer.put(f"{folder}/curr1_input", "")


def _sample(spec, writer, readable_s: float, blank_s: float):
    sampler = RailSampler(spec, DirSysfs(writer.root), rate_hz=100).start()
    time.sleep(readable_s)
    _blank_total(writer)
    time.sleep(blank_s)
    return sampler.stop()


def test_energy_of_a_rail_never_read_is_unavailable_not_zero(orin):
    spec, writer = orin
    _blank_total(writer)
    res = _sample(spec, writer, 0.0, 0.5)
    assert res.energy_j is None and res.energy_coverage is None
    assert res.cpu_energy_j is not None and res.cpu_energy_coverage > 0.9  # its rail reads


def test_energy_of_a_rail_read_half_the_run_says_its_coverage(orin):
    spec, writer = orin
    res = _sample(spec, writer, 0.5, 0.5)
    assert res.energy_j is not None
    assert 0.3 < res.energy_coverage < 0.7
    # the integral is the covered part only: 5 W over the covered time
    covered = res.energy_coverage * res.duration_s
    assert res.energy_j == pytest.approx(5.0 * covered, rel=0.02)


def test_energy_of_a_rail_read_throughout_covers_the_run(orin):
    spec, writer = orin
    sampler = RailSampler(spec, DirSysfs(writer.root), rate_hz=100).start()
    time.sleep(0.3)
    res = sampler.stop()
    assert res.energy_coverage == pytest.approx(1.0)
    assert res.energy_j == pytest.approx(5.0 * res.duration_s, rel=0.02)


# -- 2. a rail's unit ---------------------------------------------------------------------------


def _tx2_data() -> dict:
    return copy.deepcopy(load_yaml(BOARDS_DIR / "tx2.yaml"))


@pytest.mark.parametrize(("unit", "raw", "mw"), [("mW", "4200", 4200.0), ("W", "4", 4000.0)])
def test_rail_unit_scales_the_reading(tmp_path, unit, raw, mw):
    data = _tx2_data()
    data["power"]["rails"][0]["unit"] = unit
    spec = parse_board(data, "tx2-units.yaml")
    writer = write_fake_tree(load_board("tx2"), tmp_path)
    total = spec.total_rail
    writer.put(paths.iio_power(total.device, total.channel), raw)
    src = find_rail(DirSysfs(tmp_path), total)
    assert src is not None and src.unit == unit
    assert read_power_mw(DirSysfs(tmp_path), src) == pytest.approx(mw)


def test_rail_in_microwatts(tmp_path):
    writer = write_fake_tree(load_board("tx2"), tmp_path)
    base = load_board("tx2").total_rail
    rail = dataclasses.replace(base, unit="uW")
    writer.put(paths.iio_power(rail.device, rail.channel), "4200000")
    src = find_rail(DirSysfs(tmp_path), rail)
    assert read_power_mw(DirSysfs(tmp_path), src) == pytest.approx(4200.0)


@pytest.mark.parametrize(
    ("board", "index", "unit"),
    [("tx2", 0, "kW"), ("tx2", 1, "mw"), ("orin-nx", 0, "W")],  # hwmon reads mV x mA: mW
)
def test_rail_unit_that_cannot_be_read_is_refused(board, index, unit):
    data = copy.deepcopy(load_yaml(BOARDS_DIR / f"{board}.yaml"))
    data["power"]["rails"][index]["unit"] = unit
    with pytest.raises(SpecError) as err:
        parse_board(data, "bad-unit.yaml")
    assert err.value.file == "bad-unit.yaml"
    assert err.value.key == f"power.rails[{index}].unit" and err.value.got == unit


def test_rail_spec_built_in_code_with_a_bad_unit_is_refused(tmp_path):
    write_fake_tree(load_board("tx2"), tmp_path)
    rail = RailSpec("VDD_IN", "total", "iio", "x/iio:device1", 0, unit="kW")
    with pytest.raises(SpecError):
        find_rail(DirSysfs(tmp_path), rail)


# -- 3. QCM6490/QCS6490 boards that are not a RUBIK Pi 3 ---------------------------------------


def _dt(tmp_path, compatible, model):
    dt = tmp_path / "proc/device-tree"
    dt.mkdir(parents=True)
    (dt / "compatible").write_bytes(("\0".join(compatible) + "\0").encode())
    if model is not None:
        (dt / "model").write_bytes((model + "\0").encode())
    return DirSysfs(tmp_path)


@pytest.mark.parametrize(
    ("compatible", "model"),
    [
        (["fairphone,fp5", "qcom,qcm6490"], "Fairphone 5"),
        (["qcom,qcs6490-rb3gen2", "qcom,qcs6490"], "Qualcomm Technologies, Inc. Robotics RB3gen2"),
        (["qcom,qcm6490"], None),
    ],
)
def test_soc_compatible_alone_is_not_a_rubikpi3(tmp_path, compatible, model):
    assert detect_board(_dt(tmp_path, compatible, model)) is None


def test_soc_compatible_confirmed_by_the_model_is_a_rubikpi3(tmp_path):
    s = _dt(tmp_path, ["qcom,qcm6490-rb3gen2", "qcom,qcm6490"], "Thundercomm, Inc. RUBIK Pi 3")
    assert detect_board(s) == "rubikpi3"


def test_soc_compatible_needs_model_strings_and_stays_apart():
    data = copy.deepcopy(load_yaml(BOARDS_DIR / "rubikpi3.yaml"))
    assert "qcom,qcm6490" in parse_board(data, "r.yaml").soc_compatible
    no_model = copy.deepcopy(data)
    no_model["detect"]["model"] = []
    with pytest.raises(SpecError, match="detect.model"):
        parse_board(no_model, "r.yaml")
    both = copy.deepcopy(data)
    both["detect"]["compatible"].append("qcom,qcm6490")
    with pytest.raises(SpecError, match="detect.soc_compatible"):
        parse_board(both, "r.yaml")


# -- 4. the total rail of an unknown Jetson -----------------------------------------------------


@pytest.mark.parametrize(
    ("label", "role"),
    [
        ("VDD_IN", "total"),
        ("POM_5V_IN", "total"),
        ("VIN", "total"),
        ("VIN_5V", "total"),
        ("VIN_SYS_5V0", "sub"),  # AGX Orin's system 5 V supply, a sub-rail (jtop agrees)
        ("POM_5V_CPU", "cpu"),
        ("POM_5V_GPU", "sub"),
        ("VDD_IN_2", "sub"),
    ],
)
def test_guess_role_of_input_labels(label, role):
    assert guess_role(label) == role
    assert is_total_label(label) == (role == "total")


def test_probe_finds_pom_5v_in_as_the_total_of_an_unknown_jetson(tmp_path):
    base = load_board("tx2")
    stranger = dataclasses.replace(
        base, name="nano", compatible=("nvidia,p3450-0000",), model=("Jetson Nano",)
    )
    write_fake_tree(stranger, tmp_path)
    total, cpu = base.total_rail, base.cpu_rail
    (tmp_path / paths.iio_rail_name(total.device, total.channel)).write_text("POM_5V_IN\n")
    (tmp_path / paths.iio_rail_name(cpu.device, cpu.channel)).write_text("POM_5V_CPU\n")
    result = probe(DirSysfs(tmp_path))
    assert result.board is None
    roles = {r.name: r.role for r in result.spec.rails}
    assert roles["POM_5V_IN"] == "total" and roles["POM_5V_CPU"] == "cpu"
    assert sum(r == "total" for r in roles.values()) == 1
    assert result.spec.total_rail.name == "POM_5V_IN"


# -- 5. trace info leaves out zones that are not temperatures -----------------------------------


def _trace(tmp_path, board, zones: list[tuple[str, list[str | None]]]):
    header = {
        "format": "hidvfs-trace",
        "version": 1,
        "board": board,
        "period_s": 0.5,
        "started": "2024-05-01T10:00:00+00:00",
        "files": [],
    }
    n = max(len(v) for _, v in zones)
    rows = []
    for k in range(n):
        r = {}
        for i, (ztype, values) in enumerate(zones):
            if k == 0:
                r[f"{paths.zone_dir(i)}/type"] = ztype
            if k < len(values):
                r[f"{paths.zone_dir(i)}/temp"] = values[k]
        rows.append({"t": k * 0.5, "r": r, "w": {}})
    p = tmp_path / "z.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in [header, *rows]))
    return read_trace(p)


@pytest.mark.parametrize("board", ["rubikpi3", "unknown"])  # by the spec, or by type alone
def test_trace_info_leaves_out_zones_that_are_not_temperatures(tmp_path, board):
    trace = _trace(
        tmp_path,
        board,
        [
            ("cpu0-thermal", ["45000", "47500"]),
            ("pm7250b-ibat-lvl0", ["1500", "1800"]),
            ("pm7250b-bcl-lvl0", ["0", "0"]),
            ("PMIC-Die", ["100000", "100000"]),
            ("xo-thermal", ["41000", "250000"]),  # one implausible reading
            ("ddr-thermal", ["95", "96"]),  # °C written as m°C: no temperature at all
        ],
    )
    info = trace_info(trace)
    assert info["zones_c"] == {
        "cpu0-thermal": {"min": 45.0, "max": 47.5},
        "xo-thermal": {"min": 41.0, "max": 41.0},
    }
    skipped = info["zones_skipped"]
    assert set(skipped) == {"pm7250b-ibat-lvl0", "pm7250b-bcl-lvl0", "PMIC-Die", "ddr-thermal"}
    assert "PMIC" in skipped["PMIC-Die"] and "°C" in skipped["ddr-thermal"]
    assert info["implausible_temps"] == 3
    text = format_info(info)
    assert "pm7250b-ibat-lvl0  1.5" not in text and "PMIC-Die  100.0" not in text
    assert "not temperatures" in text and "3 implausible readings" in text


def test_a_rail_in_microwatts_reads_back_its_power_from_the_fake_tree_and_probe(tmp_path):
    """The reader scaled by the spec's unit, the fake tree still wrote mW: 1000x off."""
    import dataclasses

    from platforms import power
    from platforms.faketree import write_fake_tree
    from platforms.probe import probe
    from platforms.spec import load_board
    from platforms.sysfs import DirSysfs

    tx2 = load_board("tx2")
    rails = tuple(dataclasses.replace(r, unit="uW") for r in tx2.rails)
    spec = dataclasses.replace(tx2, rails=rails)
    w = write_fake_tree(spec, tmp_path)
    rail = spec.rails[0]
    w.set_power(rail.name, 4200.0)
    sysfs = DirSysfs(tmp_path)
    src = power.find_rail(sysfs, rail)
    assert power.read_power_mw(sysfs, src) == pytest.approx(4200.0)
    found = probe(sysfs, [spec]).spec
    assert {r.unit for r in found.rails} == {"uW"}
