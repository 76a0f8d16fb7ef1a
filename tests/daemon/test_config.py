"""The daemon config: defaults, the shipped file, precise errors, typo suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon import config as cfgmod
from daemon.config import Config, ConfigError, known_keys, load_config, parse_config, parse_listen

SHIPPED = Path(__file__).resolve().parents[2] / "systemd" / "config.yaml"


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "thermal.cap_khz":
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def test_missing_default_file_means_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(cfgmod, "DEFAULT_PATH", str(tmp_path / "absent.yaml"))
    cfg = load_config()
    assert cfg == Config()
    assert cfg.period_ms == 100 and cfg.period_s == pytest.approx(0.1)
    assert cfg.socket.path == "/run/hidvfs/hidvfs.sock"
    assert cfg.socket.group == "hidvfs" and cfg.socket.mode == 0o660
    assert cfg.state_dir == "/var/lib/hidvfs"
    assert cfg.metrics.enabled is False and cfg.metrics.listen == "127.0.0.1:9466"
    assert cfg.telemetry.listen is None
    assert cfg.mixed_criticality.reserve is True and cfg.recheck_each_tick is True
    assert cfg.board is None and cfg.logging.format == "keyvalue"


def test_default_path_present_is_read(tmp_path, monkeypatch):
    p = tmp_path / "config.yaml"
    p.write_text("period_ms: 250\n")
    monkeypatch.setattr(cfgmod, "DEFAULT_PATH", str(p))
    assert load_config().period_ms == 250


def test_explicit_missing_file_is_an_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as exc:
        load_config(missing)
    assert str(missing) in str(exc.value) and "no such file" in str(exc.value)


def test_empty_file_gives_defaults(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("# nothing\n")
    assert load_config(p) == Config()


def test_invalid_yaml_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("period_ms: [1,\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(p) in str(exc.value) and "valid YAML" in str(exc.value)


def test_a_config_that_is_not_utf8_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"policy: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*UTF-8"):
        load_config(p)


def test_a_board_spec_path_ending_in_yml_is_loaded(tmp_path):
    """The config accepts .yaml and .yml board paths; the daemon loads both."""
    from daemon.service import resolve_board

    src = Path(__file__).resolve().parents[2] / "platforms" / "boards" / "tx2.yaml"
    yml = tmp_path / "tx2.yml"
    yml.write_text(src.read_text())
    cfg = parse_config({"board": str(yml)})
    assert resolve_board(cfg, None).name == "tx2"


def test_shipped_config_is_the_defaults_and_documents_every_key():
    cfg = load_config(SHIPPED)
    assert cfg == Config()
    data = yaml.safe_load(SHIPPED.read_text())
    assert set(_flatten(data)) == set(known_keys())
    # every top-level key is documented: a comment right above it or opening its block
    lines = SHIPPED.read_text().splitlines()
    for i, line in enumerate(lines):
        if (
            line
            and line[0].isalpha()
            and line.endswith(":")
            or (line[:1].isalpha() and ": " in line)
        ):
            before = next((x for x in reversed(lines[:i]) if x.strip()), "")
            after = lines[i + 1] if i + 1 < len(lines) else ""
            assert before.startswith("#") or after.strip().startswith("#"), (
                f"undocumented key: {line}"
            )


def test_values_are_read(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "period_ms: 50\npolicy: ztt\nboard: tx2\ndeadline_slack: 0.1\n"
        "thermal: {margin_c: 3, cap_khz: {a57: 1420800}}\n"
        "socket: {path: /tmp/x.sock, group: null, mode: '0600'}\n"
        "logging: {level: DEBUG, format: json}\n"
        "metrics: {enabled: true, listen: '[::1]:9000'}\n"
        "telemetry: {listen: '10.0.0.2:9467', token: s3cret}\n"
        "mixed_criticality: {reserve: false}\nrecheck_each_tick: false\n"
    )
    cfg = load_config(p)
    assert cfg.period_ms == 50 and cfg.policy == "ztt" and cfg.board == "tx2"
    assert cfg.thermal.margin_c == 3.0 and cfg.thermal.cap_khz == {"a57": 1420800}
    assert cfg.socket.group is None and cfg.socket.mode == 0o600
    assert cfg.logging.level == "debug" and cfg.logging.format == "json"
    assert cfg.metrics.enabled and parse_listen(cfg.metrics.listen) == ("::1", 9000)
    assert cfg.telemetry.token == "s3cret"
    assert cfg.mixed_criticality.reserve is False and cfg.recheck_each_tick is False
    assert cfg.source == str(p)
    assert cfgmod.config_to_dict(cfg)["thermal"]["cap_khz"] == {"a57": 1420800}


BAD = [
    ({"period_ms": 0}, "period_ms", "integer in 1..60000"),
    ({"period_ms": "fast"}, "period_ms", "integer"),
    ({"period_ms": 1.5}, "period_ms", "integer"),
    ({"period_ms": True}, "period_ms", "integer"),
    ({"policy": "turbo"}, "policy", "one of hidvfs"),
    ({"board": 3}, "board", "string"),
    ({"board": "boards/tx2.yaml"}, "board", "absolute path"),
    ({"board": "tx3"}, "board", "a shipped board (orin-nx, rubikpi3, tx2)"),
    ({"deadline_slack": 1.0}, "deadline_slack", "[0, 1)"),
    ({"deadline_slack": -0.1}, "deadline_slack", "[0, 1)"),
    ({"deadline_slack": float("nan")}, "deadline_slack", "[0, 1)"),
    ({"thermal": {"margin_c": "hot"}}, "thermal.margin_c", "number"),
    ({"thermal": {"margin_c": 90}}, "thermal.margin_c", "[0, 50]"),
    ({"thermal": {"cap_khz": [1, 2]}}, "thermal.cap_khz", "mapping"),
    ({"thermal": {"cap_khz": {"a57": -5}}}, "thermal.cap_khz.a57", "integer >= 1"),
    ({"thermal": 5}, "thermal", "mapping"),
    ({"socket": {"path": "relative.sock"}}, "socket.path", "absolute path"),
    ({"socket": {"group": ""}}, "socket.group", "non-empty string"),
    ({"socket": {"mode": "rw"}}, "socket.mode", "octal"),
    ({"socket": {"mode": 0o1777}}, "socket.mode", "0000..0777"),
    ({"socket": {"mode": 0o060}}, "socket.mode", "owner"),
    ({"state_dir": "var/lib"}, "state_dir", "absolute path"),
    ({"logging": {"level": "loud"}}, "logging.level", "one of debug"),
    ({"logging": {"format": "xml"}}, "logging.format", "keyvalue"),
    ({"metrics": {"enabled": "yes please"}}, "metrics.enabled", "true or false"),
    ({"metrics": {"listen": "9466"}}, "metrics.listen", "HOST:PORT"),
    ({"metrics": {"listen": "localhost:99999"}}, "metrics.listen", "0..65535"),
    ({"telemetry": {"listen": "0.0.0.0:9467"}}, "telemetry.token", "loopback"),
    (
        {"telemetry": {"listen": "127.0.0.1:9467", "token_file": "tok"}},
        "telemetry.token_file",
        "absolute path",
    ),
    ({"telemetry": {"token": "a", "token_file": "/x"}}, "telemetry.token_file", "not both"),
    ({"metrics": {"enabled": True, "listen": "0.0.0.0:9466"}}, "metrics.token", "loopback"),
    (
        {"metrics": {"enabled": True, "listen": "[::]:9466", "token": ""}},
        "metrics.token",
        "non-empty string",
    ),
    ({"metrics": {"token_file": "tok"}}, "metrics.token_file", "absolute path"),
    ({"metrics": {"token": "a", "token_file": "/x"}}, "metrics.token_file", "not both"),
    ({"metrics": {"token": "with space"}}, "metrics.token", "visible ASCII"),
    ({"mixed_criticality": {"reserve": 1}}, "mixed_criticality.reserve", "true or false"),
    ({"recheck_each_tick": "true"}, "recheck_each_tick", "true or false"),
]


@pytest.mark.parametrize(
    ("data", "key", "expected"), BAD, ids=[b[1] + ":" + repr(b[0]) for b in BAD]
)
def test_bad_values_name_the_key_and_the_expectation(data, key, expected):
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "cfg.yaml")
    err = exc.value
    assert err.key == key
    assert err.file == "cfg.yaml"
    assert expected in err.expected
    assert f"'{key}'" in str(err)


@pytest.mark.parametrize(
    ("data", "key", "hint"),
    [
        ({"perod_ms": 5}, "perod_ms", "period_ms"),
        ({"polcy": "ztt"}, "polcy", "policy"),
        ({"thermal": {"margn_c": 5}}, "thermal.margn_c", "thermal.margin_c"),
        ({"margin_c": 5}, "margin_c", "thermal.margin_c"),
        ({"socket": {"paht": "/x"}}, "socket.paht", "socket.path"),
        ({"metrics": {"enable": True}}, "metrics.enable", "metrics.enabled"),
        ({"recheck_every_tick": True}, "recheck_every_tick", "recheck_each_tick"),
    ],
)
def test_unknown_keys_suggest_the_closest(data, key, hint):
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "cfg.yaml")
    assert exc.value.key == key
    assert f"did you mean '{hint}'?" in str(exc.value)


def test_unknown_key_without_a_close_match_lists_known_keys():
    with pytest.raises(ConfigError) as exc:
        parse_config({"zzzzzzzz": 1})
    assert "did you mean" not in str(exc.value)
    assert "period_ms" in str(exc.value)


def test_telemetry_token_allows_remote_listen():
    cfg = parse_config({"telemetry": {"listen": "0.0.0.0:9467", "token": "t"}})
    assert cfg.telemetry.listen == "0.0.0.0:9467"


def test_metrics_follow_the_telemetry_token_rule():
    """A remote metrics address needs a token, as telemetry's does; loopback needs none, and a
    disabled endpoint binds nothing, so its address needs none either."""
    cfg = parse_config({"metrics": {"enabled": True, "listen": "0.0.0.0:9466", "token": "t"}})
    assert cfg.metrics.token == "t" and cfg.metrics.listen == "0.0.0.0:9466"
    assert parse_config({"metrics": {"enabled": True}}).metrics.token is None
    assert parse_config({"metrics": {"listen": "0.0.0.0:9466"}}).metrics.enabled is False


@pytest.mark.parametrize(
    "metrics, telemetry",
    [
        ("127.0.0.1:19466", "127.0.0.1:19466"),
        ("localhost:19466", "127.0.0.1:19466"),
        ("127.0.0.1:19466", "0.0.0.0:19466"),
        ("[::]:19466", "[::1]:19466"),
    ],
)
def test_metrics_and_telemetry_on_one_port_are_refused_with_the_config(metrics, telemetry):
    """Caught only when the second endpoint failed to bind, after the daemon took the board
    ("[Errno 98] telemetry: cannot listen"): said with the config now."""
    tokens = {"token": "t"}
    with pytest.raises(ConfigError, match="telemetry.listen.*a port other than metrics.listen"):
        parse_config(
            {
                "metrics": {"enabled": True, "listen": metrics, **tokens},
                "telemetry": {"listen": telemetry, **tokens},
            }
        )


def test_metrics_and_telemetry_may_share_a_port_number_on_distinct_hosts_or_when_off():
    cfg = parse_config(
        {
            "metrics": {"enabled": True, "listen": "10.0.0.1:19466", "token": "t"},
            "telemetry": {"listen": "10.0.0.2:19466", "token": "t"},
        }
    )
    assert cfg.telemetry.listen == "10.0.0.2:19466"
    off = {"metrics": {"listen": "127.0.0.1:19466"}, "telemetry": {"listen": "127.0.0.1:19466"}}
    assert parse_config(off).metrics.enabled is False


def test_read_token_from_file_names_the_section(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("m3tr1cs\n")
    tok.chmod(0o600)
    cfg = parse_config(
        {"metrics": {"enabled": True, "listen": "10.1.1.1:1", "token_file": str(tok)}}
    )
    assert cfgmod.read_token(cfg.metrics, "metrics") == "m3tr1cs"
    tok.chmod(0o640)
    with pytest.raises(ConfigError) as exc:
        cfgmod.read_token(cfg.metrics, "metrics")
    assert exc.value.key == "metrics.token_file"


def test_read_token_from_file(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("abc123\n")
    tok.chmod(0o600)
    cfg = parse_config({"telemetry": {"listen": "10.1.1.1:1", "token_file": str(tok)}})
    assert cfgmod.read_token(cfg.telemetry) == "abc123"
    tok.chmod(0o644)  # others could read the secret: refused, with the fix in the message
    with pytest.raises(ConfigError, match="chmod 600"):
        cfgmod.read_token(cfg.telemetry)
    tok.chmod(0o600)
    tok.write_text("\n")
    with pytest.raises(ConfigError):
        cfgmod.read_token(cfg.telemetry)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9466", ("127.0.0.1", 9466)),
        ("[::1]:80", ("::1", 80)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9466", ":80", "::1:80", "host:port", "[::1]80", "h:-1"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError):
        parse_listen(text)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=60_000))
def test_any_valid_period_is_kept(ms):
    assert parse_config({"period_ms": ms}).period_ms == ms


_KNOWN_TOP = {k.split(".")[0] for k in known_keys()}


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20).filter(
        lambda k: k not in _KNOWN_TOP
    )
)
def test_any_unknown_top_level_key_is_refused_by_name(key):
    with pytest.raises(ConfigError) as exc:
        parse_config({key: 1})
    assert exc.value.key == key


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.text(max_size=5),
        st.floats(allow_nan=True),
        st.lists(st.integers(), max_size=2),
        st.booleans(),
    )
)
def test_period_of_a_non_integer_type_is_refused(v):
    with pytest.raises(ConfigError) as exc:
        parse_config({"period_ms": v})
    assert exc.value.key == "period_ms"


@pytest.mark.parametrize("token", ["tökén", "with space", "tab\tx"])
def test_a_telemetry_token_must_be_visible_ascii(token):
    """Headers arrive as latin-1: a non-ASCII token could never authenticate."""
    with pytest.raises(ConfigError, match="telemetry.token.*visible ASCII"):
        parse_config({"telemetry": {"listen": "127.0.0.1:9130", "token": token}})


@pytest.mark.parametrize(
    "text, where, problem",
    [
        (
            "period_ms: 100\npolicy: [a, b\n",
            "line 3, column 1",
            "expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence started at line 2, column 9)",
        ),
        ("policy: a: b\n", "line 1, column 10", "mapping values are not allowed here"),
        (
            "thermal:\n\tmargin_c: 3\n",
            "line 2, column 1",
            "found character '\\t' that cannot start any token (while scanning for the next token)",
        ),
        ("policy: *p\n", "line 1, column 9", "found undefined alias 'p'"),
        (
            "policy: a\x07\n",
            "character 10",
            "unacceptable character #x0007: special characters are not allowed",
        ),
    ],
)
def test_invalid_yaml_is_one_line_with_line_column_and_problem(tmp_path, text, where, problem):
    """Not PyYAML's five lines with the file name twice and snippets of the source."""
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(exc.value) == f"{p}: {where}: not valid YAML: {problem}"
    assert exc.value.file == str(p) and exc.value.key == "<file>"


def test_a_shipped_board_named_on_another_detected_board_is_refused(tmp_path):
    """orin-nx's OPPs written to a TX2 (or a profile measured there stored as orin-nx's):
    a named shipped board must be the detected one; a spec file, or an undetected tree,
    is taken as given."""
    from daemon.service import DaemonError, resolve_board
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board
    from platforms.sysfs import DirSysfs

    write_fake_tree(load_board("tx2"), tmp_path / "tx2")
    sysfs = DirSysfs(tmp_path / "tx2")
    with pytest.raises(DaemonError, match="'orin-nx' was asked for, but .* detected as 'tx2'"):
        resolve_board(parse_config({"board": "orin-nx"}), sysfs)
    assert resolve_board(parse_config({"board": "tx2"}), sysfs).name == "tx2"
    (tmp_path / "bare").mkdir()  # nothing to detect: the name is taken as given
    assert resolve_board(parse_config({"board": "orin-nx"}), DirSysfs(tmp_path / "bare")).name == (
        "orin-nx"
    )


def test_a_spec_file_of_another_shipped_board_is_refused_on_a_detected_board(tmp_path):
    """A copy of orin-nx.yaml given by path on a TX2 went through as given: orin-nx's OPPs
    written to a TX2, a profile stored as orin-nx's. A spec of a board of its own name (a
    board not shipped, or a user's variant) is still taken as given."""
    from daemon.service import DaemonError, resolve_board
    from platforms.faketree import write_fake_tree
    from platforms.spec import load_board
    from platforms.sysfs import DirSysfs

    write_fake_tree(load_board("tx2"), tmp_path / "tx2")
    sysfs = DirSysfs(tmp_path / "tx2")
    boards = Path(__file__).resolve().parents[2] / "platforms" / "boards"
    orin = tmp_path / "o.yaml"
    orin.write_text((boards / "orin-nx.yaml").read_text())
    with pytest.raises(DaemonError, match=r"o\.yaml is a spec of 'orin-nx', but .* 'tx2'"):
        resolve_board(parse_config({"board": str(orin)}), sysfs)
    own = tmp_path / "tx2.yaml"
    own.write_text((boards / "tx2.yaml").read_text())
    assert resolve_board(parse_config({"board": str(own)}), sysfs).name == "tx2"
    mine = tmp_path / "mine.yaml"
    mine.write_text((boards / "orin-nx.yaml").read_text().replace("name: orin-nx", "name: my-orin"))
    assert resolve_board(parse_config({"board": str(mine)}), sysfs).name == "my-orin"


@pytest.mark.parametrize("section", ["telemetry", "metrics"])
@pytest.mark.parametrize(
    ("raw", "secret"),
    [
        ("123456789012", "123456789012"),  # all digits: YAML reads an int
        ("[s3cr3tA, s3cr3tB]", "s3cr3t"),
        ("{s3cr3t: 1}", "s3cr3t"),
        ("yes", "True"),
        ("12345.678", "12345"),
    ],
)
def test_a_token_of_the_wrong_type_is_never_echoed(tmp_path, section, raw, secret):
    """A start error printed a non-string token in full (the ASCII check said <hidden>)."""
    p = tmp_path / "c.yaml"
    p.write_text(f"{section}: {{token: {raw}}}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert exc.value.key == f"{section}.token"
    assert secret not in str(exc.value) and "<hidden>" in str(exc.value)
    assert "quote" in exc.value.expected  # how to write an all-digit token


def test_an_empty_token_is_refused_without_echo():
    with pytest.raises(ConfigError) as exc:
        parse_config({"telemetry": {"token": "  "}})
    assert exc.value.key == "telemetry.token" and "<hidden>" in str(exc.value)
