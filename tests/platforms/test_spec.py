"""Shipped board specs load; malformed specs fail naming the file and the key."""

from __future__ import annotations

import copy

import pytest
import yaml

from platforms.errors import SpecError, UnknownBoard
from platforms.spec import BOARDS_DIR, board_names, load_board, load_board_file, parse_board

BOARDS = ["orin-nx", "rubikpi3", "tx2"]


def test_the_three_boards_ship():
    assert board_names() == BOARDS


@pytest.mark.parametrize("name", BOARDS)
def test_shipped_spec_loads_and_is_consistent(name):
    spec = load_board(name)
    assert spec.name == name
    assert spec.clusters, "a board has at least one cluster"
    for c in spec.clusters:
        assert c.policy in c.cpus
        assert list(c.freqs_khz) == sorted(set(c.freqs_khz))
        assert c.default_governor in c.governors
        assert not set(c.modular_governors) & set(c.governors)
    assert len(set(spec.cpus)) == spec.ncpus
    names = {c.name for c in spec.clusters}
    for z in spec.zones:
        assert set(z.clusters) <= names
    assert sum(r.role == "total" for r in spec.rails) <= 1


def test_board_specific_facts():
    tx2, orin, rubik = (load_board(n) for n in ("tx2", "orin-nx", "rubikpi3"))
    assert tx2.cluster("a57").cpus == (0, 3, 4, 5)
    assert tx2.cluster("denver").offline_by_default == (1, 2)
    assert tx2.total_rail.name == "VDD_IN" and tx2.cpu_rail.name == "VDD_SYS_CPU"
    assert orin.cluster("a78ae_0").fmax_khz == 1984000
    assert [c.policy for c in rubik.clusters] == [0, 4, 7]
    assert rubik.rails == ()
    assert {"powersave", "conservative"} == set(rubik.cluster("gold").modular_governors)
    assert not rubik.zone("pm7250b-ibat-lvl0").is_temperature


def test_unknown_board_lists_the_known_ones():
    with pytest.raises(UnknownBoard, match="orin-nx, rubikpi3, tx2"):
        load_board("nano")
    # a name is a shipped board, never a path (a trace header or a config names it)
    for bad in ("../boards/tx2", "/etc/hidvfs/x", "", "TX2/"):
        with pytest.raises(UnknownBoard):
            load_board(bad)


def _raw(name="tx2"):
    with open(BOARDS_DIR / f"{name}.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def _fails(tmp_path, data, key_fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as exc:
        load_board_file(path)
    msg = str(exc.value)
    assert str(path) in msg, msg
    assert key_fragment in msg, msg
    return exc.value


def test_missing_key(tmp_path):
    data = _raw()
    del data["clusters"][1]["freqs_khz"]
    err = _fails(tmp_path, data, "clusters[1].freqs_khz")
    assert "missing" in str(err)


def test_missing_top_level_name(tmp_path):
    data = _raw()
    del data["name"]
    _fails(tmp_path, data, "'name'")


def test_wrong_type(tmp_path):
    data = _raw()
    data["clusters"][0]["policy"] = "zero"
    err = _fails(tmp_path, data, "clusters[0].policy")
    assert err.got == "zero"


def test_wrong_type_bool_is_not_an_int(tmp_path):
    data = _raw()
    data["clusters"][0]["transition_latency_ns"] = True
    _fails(tmp_path, data, "clusters[0].transition_latency_ns")


def test_bad_default_governor(tmp_path):
    data = _raw()
    data["clusters"][0]["default_governor"] = "turbo"
    err = _fails(tmp_path, data, "clusters[0].default_governor")
    assert "turbo" in str(err)


@pytest.mark.parametrize(
    "freqs", [[345600, 345600, 499200], [499200, 345600], [], [0, 345600], [-1, 5]]
)
def test_non_increasing_or_non_positive_frequencies(tmp_path, freqs):
    data = _raw()
    data["clusters"][0]["freqs_khz"] = freqs
    _fails(tmp_path, data, "clusters[0].freqs_khz")


def test_unknown_cluster_in_a_zone(tmp_path):
    data = _raw()
    data["thermal"]["zones"][0]["clusters"] = ["a57", "carmel"]
    err = _fails(tmp_path, data, "thermal.zones[0].clusters")
    assert "carmel" in str(err)


def test_bad_zone_role_and_quirk(tmp_path):
    data = _raw()
    bad = copy.deepcopy(data)
    bad["thermal"]["zones"][2]["role"] = "hot"
    _fails(tmp_path, bad, "thermal.zones[2].role")
    bad = copy.deepcopy(data)
    bad["thermal"]["zones"][2]["quirk"] = "flaky"
    _fails(tmp_path, bad, "thermal.zones[2].quirk")


def test_policy_must_be_a_cpu_of_the_cluster(tmp_path):
    data = _raw()
    data["clusters"][1]["policy"] = 3
    _fails(tmp_path, data, "clusters[1].policy")


def test_two_total_rails_refused(tmp_path):
    data = _raw()
    data["power"]["rails"][1]["role"] = "total"
    _fails(tmp_path, data, "power.rails")


def test_unreadable_and_invalid_yaml_files(tmp_path):
    with pytest.raises(SpecError, match="readable YAML"):
        load_board_file(tmp_path / "absent.yaml")
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="valid YAML"):
        load_board_file(bad)


def test_parse_board_round_trips_a_shipped_file():
    assert parse_board(_raw("rubikpi3"), "x.yaml").clusters == load_board("rubikpi3").clusters


def test_a_yaml_syntax_error_is_one_line_naming_file_line_and_column(tmp_path):
    """The same one-line form as the daemon config (PyYAML's own spans five lines)."""
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nclusters: [unclosed\n")
    with pytest.raises(SpecError) as exc:
        load_board_file(bad)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{bad}: line 3, column 1: not valid YAML: expected ',' or ']'")
    assert "started at line 2, column 11" in msg


def test_a_board_file_that_is_not_utf8_is_named(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError, match=r"latin1.yaml: key '<file>': expected a UTF-8 text file"):
        load_board_file(bad)


# -- zone aliases (boards.md sections 3.6 and 4.5) ---------------------------------------------


def test_shipped_aliases_name_the_other_bsps_zones():
    orin, rubik = load_board("orin-nx"), load_board("rubikpi3")
    assert orin.zone("cpu-thermal").names == ("cpu-thermal", "CPU-therm")
    assert orin.zone("CPU-therm") is orin.zone("cpu-thermal")
    assert orin.zone("SOC0-therm").type == "soc0-thermal"
    assert [rubik.zone(f"cpu-1-{i}-usr").clusters for i in range(4)] == [("gold",)] * 4
    assert load_board("tx2").zone("BCPU-therm").aliases == ()


def _with_zones(zones):
    data = _raw("orin-nx")
    data["thermal"]["zones"] = zones
    return data


def test_aliases_are_optional_and_a_bare_string_is_one(tmp_path):
    zones = [
        {"type": "cpu-thermal", "role": "cpu", "aliases": "CPU-therm"},
        {"type": "gpu-thermal", "role": "gpu"},
        # two zones of one type stay allowed (what files without aliases may hold)
        {"type": "gpu-thermal", "role": "gpu"},
    ]
    spec = parse_board(_with_zones(zones), "user.yaml")
    assert spec.zones[0].aliases == ("CPU-therm",)
    assert spec.zones[1].aliases == spec.zones[2].aliases == ()


@pytest.mark.parametrize(
    "aliases, key, words",
    [
        (5, "thermal.zones[0].aliases", "a list of other type strings"),
        ([["CPU-therm"]], "thermal.zones[0].aliases", "a list of other type strings"),
        ([""], "thermal.zones[0].aliases[0]", "non-empty"),
        (["CPU-therm "], "thermal.zones[0].aliases[0]", "no surrounding spaces"),
        (["cpu-thermal"], "thermal.zones[0].aliases[0]", "a type other than 'cpu-thermal'"),
        (["CPU-therm", "CPU-therm"], "thermal.zones[0].aliases[1]", "not repeated"),
        (["gpu-thermal"], "thermal.zones[0].aliases[0]", "thermal.zones[1], 'gpu-thermal'"),
    ],
)
def test_bad_aliases_name_the_file_and_key(tmp_path, aliases, key, words):
    zones = [
        {"type": "cpu-thermal", "role": "cpu", "aliases": aliases},
        {"type": "gpu-thermal", "role": "gpu"},
    ]
    err = _fails(tmp_path, _with_zones(zones), key)
    assert words in str(err), str(err)


def test_an_alias_names_one_zone_only(tmp_path):
    zones = [
        {"type": "cpu-thermal", "role": "cpu", "aliases": ["CPU-therm"]},
        {"type": "gpu-thermal", "role": "gpu", "aliases": ["CPU-therm"]},
    ]
    err = _fails(tmp_path, _with_zones(zones), "thermal.zones[1].aliases[0]")
    assert "thermal.zones[0], 'cpu-thermal'" in str(err)
