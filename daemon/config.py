"""The daemon's YAML config: a dataclass tree, validated once at start.

Every key has a default (the shipped ``systemd/config.yaml`` spells them all out and documents
them), so an empty or absent default file means "all defaults". A bad value fails at start with
an error naming the file, the dotted key, what was expected and what was found; an unknown key
fails too, suggesting the closest known key (a typo must never be silently ignored, unlike tuned).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

from agents.factory import POLICY_NAMES
from platforms.errors import SpecError
from platforms.spec import board_names
from platforms.yamlfile import YamlSyntaxError, read_yaml

DEFAULT_PATH = "/etc/hidvfs/config.yaml"
DEFAULT_SOCKET = "/run/hidvfs/hidvfs.sock"
DEFAULT_STATE_DIR = "/var/lib/hidvfs"
DEFAULT_PROFILES = "/var/lib/hidvfs/profiles.json"

#: decision policies the daemon can run (DESIGN.md, "Policy names"; one list in agents.factory)
POLICIES = POLICY_NAMES
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("keyvalue", "json")


class ConfigError(SpecError):
    """A config value is missing, of the wrong type, out of range, or an unknown key."""


class ConfigSyntaxError(YamlSyntaxError, ConfigError):
    """The config file is not YAML: one line naming the file, where, and PyYAML's problem."""


@dataclass(frozen=True)
class ThermalConfig:
    #: the guard caps a cluster once its hottest zone reaches (passive trip - margin_c)
    margin_c: float = 5.0
    #: static per-cluster ceilings in kHz, never exceeded whatever the policy says; {} = none
    cap_khz: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SocketConfig:
    path: str = DEFAULT_SOCKET
    #: group allowed to use the socket; None (or a missing group) keeps it root-only
    group: str | None = "hidvfs"
    mode: int = 0o660


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "info"
    format: str = "keyvalue"


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = False
    listen: str = "127.0.0.1:9466"
    #: bearer token; required when ``listen`` is not a loopback address (as for telemetry)
    token: str | None = None
    #: read the token from this file instead (keeps it out of a world-readable config)
    token_file: str | None = None


@dataclass(frozen=True)
class TelemetryConfig:
    #: "host:port" of the HTTP JSON status endpoint; None = off
    listen: str | None = None
    #: bearer token; required when ``listen`` is not a loopback address
    token: str | None = None
    #: read the token from this file instead (keeps it out of a world-readable config)
    token_file: str | None = None


@dataclass(frozen=True)
class MixedCriticalityConfig:
    #: keep enough cores/frequency in reserve for every registered hi job before lo jobs
    reserve: bool = True


@dataclass(frozen=True)
class ShieldConfig:
    #: the hidvfs shield's calibration follows the realised response times online
    #: (Gibbs-Candes adaptive conformal), starting from the shipped calibration
    adaptive: bool = False
    #: its step; larger adapts faster and wanders more
    gamma: float = 0.005


@dataclass(frozen=True)
class Config:
    period_ms: int = 100
    policy: str = "hidvfs"
    #: board spec override (a shipped board name or a spec .yaml path); None = detect
    board: str | None = None
    #: fraction of each deadline kept as safety margin when planning (0 = plan to the deadline)
    deadline_slack: float = 0.05
    #: reference profiles (``hidvfs profile measure``) looked up by job name at registration;
    #: a job without one still runs, but the gate and the shield cannot plan its deadline
    profiles: str = DEFAULT_PROFILES
    thermal: ThermalConfig = field(default_factory=ThermalConfig)
    socket: SocketConfig = field(default_factory=SocketConfig)
    state_dir: str = DEFAULT_STATE_DIR
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    mixed_criticality: MixedCriticalityConfig = field(default_factory=MixedCriticalityConfig)
    shield: ShieldConfig = field(default_factory=ShieldConfig)
    #: re-read the cpufreq limits every tick and log settings changed behind our back
    recheck_each_tick: bool = True
    #: file the config was loaded from ("<defaults>" when none)
    source: str = field(default="<defaults>", compare=False)

    @property
    def period_s(self) -> float:
        return self.period_ms / 1000.0


# --------------------------------------------------------------------------------------------
# Helpers shared with the HTTP endpoints


def parse_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:9466`` / ``[::1]:9466`` / ``localhost:80`` -> (host, port); ValueError else."""
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if text.startswith("["):
        host, sep, port_txt = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"expected [IPv6]:PORT, got {text!r}")
    else:
        host, _, port_txt = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"write an IPv6 address in brackets ([::1]:PORT), got {text!r}")
    if not host:
        raise ValueError(f"expected HOST:PORT with a host, got {text!r}")
    try:
        port = int(port_txt)
    except ValueError:
        raise ValueError(f"port must be an integer, got {port_txt!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    return host, port


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; any other name counts as remote."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------------------------
# Validation


def _section_type(cls: type, name: str) -> type | None:
    """The dataclass type of a nested section field (``Config.thermal`` -> ThermalConfig)."""
    for f in fields(cls):
        if f.name == name and f.default_factory is not MISSING:
            value = f.default_factory()
            return type(value) if is_dataclass(value) else None
    return None


def known_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config (``thermal.margin_c``, ...), sections excluded."""
    out = []
    for f in fields(cls):
        if f.name == "source":
            continue
        sub = _section_type(cls, f.name)
        if sub is not None:
            out.extend(known_keys(sub, f"{prefix}{f.name}."))
        else:
            out.append(f"{prefix}{f.name}")
    return out


def _suggest(key: str, where: str, siblings: list[str]) -> str:
    full = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
    if close:
        return f"{where}.{close[0]}" if where else close[0]
    # maybe the right key in the wrong section (e.g. 'margin_c' at the top level)
    leaves = known_keys()
    close = difflib.get_close_matches(full, leaves, n=1, cutoff=0.6)
    if not close:
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in leaves}
        hit = difflib.get_close_matches(key, list(by_leaf), n=1, cutoff=0.75)
        close = [by_leaf[hit[0]]] if hit else []
    return close[0] if close else ""


class _Checker:
    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, expected: str, got: Any) -> ConfigError:
        # SpecError drops a ``got`` of None; spell it out so "null" errors are explicit.
        return ConfigError(self.file, key, expected, "null" if got is None else got)

    def int_(self, key: str, v: Any, lo: int | None = None, hi: int | None = None) -> int:
        rng = _range_text(lo, hi)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(key, f"an integer{rng}", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.fail(key, f"an integer{rng}", v)
        return v

    def float_(self, key: str, v: Any, lo: float, hi: float, hi_open: bool = False) -> float:
        bracket = ")" if hi_open else "]"
        expected = f"a number in [{lo:g}, {hi:g}{bracket}"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(key, expected, v)
        x = float(v)
        if not math.isfinite(x) or x < lo or x > hi or (hi_open and x >= hi):
            raise self.fail(key, expected, v)
        return x

    def bool_(self, key: str, v: Any) -> bool:
        if not isinstance(v, bool):
            raise self.fail(key, "true or false", v)
        return v

    def str_(self, key: str, v: Any, optional: bool = False) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or not v.strip():
            raise self.fail(key, "a non-empty string" + (" or null" if optional else ""), v)
        return v

    def token(self, key: str, v: Any) -> str | None:
        """A bearer token, checked like ``str_`` but never echoed: YAML reads an all-digit
        token as an int, and a start error must not print it."""
        if v is None:
            return None
        if not isinstance(v, str) or not v.strip():
            expected = "a non-empty string or null (quote an all-digit token)"
            raise self.fail(key, expected, "<hidden>")
        return v

    def choice(self, key: str, v: Any, options: tuple[str, ...], fold: bool = False) -> str:
        text = v.lower() if fold and isinstance(v, str) else v
        if text not in options:
            raise self.fail(key, f"one of {', '.join(options)}", v)
        return text

    def abspath(self, key: str, v: Any) -> str:
        s = self.str_(key, v)
        if not os.path.isabs(s):
            raise self.fail(key, "an absolute path", v)
        return s

    def listen(self, key: str, v: Any, optional: bool = False) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str):
            raise self.fail(
                key, "HOST:PORT (e.g. 127.0.0.1:9466)" + (" or null" if optional else ""), v
            )
        try:
            parse_listen(v)
        except ValueError as err:
            raise self.fail(key, f"HOST:PORT ({err})", v) from None
        return v


def _range_text(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" in {lo}..{hi}"
    if lo is not None:
        return f" >= {lo}"
    return ""


def _check_distinct_ports(c: _Checker, metrics_listen: str, telemetry_listen: str) -> None:
    """Both endpoints on one port fail only when the second binds, after the daemon took the
    board: said with the config instead. A wildcard host (0.0.0.0, ::) overlaps every host."""
    (m_host, m_port), (t_host, t_port) = (
        parse_listen(metrics_listen),
        parse_listen(telemetry_listen),
    )
    wildcard, loopback = {"0.0.0.0", "::", ""}, {"localhost", "127.0.0.1", "::1"}
    overlap = (
        m_host == t_host or m_host in wildcard or t_host in wildcard or {m_host, t_host} <= loopback
    )
    if m_port == t_port and m_port != 0 and overlap:
        raise c.fail(
            "telemetry.listen",
            f"a port other than metrics.listen's ({metrics_listen}): both endpoints cannot "
            "listen on one port",
            telemetry_listen,
        )


def _mode(c: _Checker, key: str, v: Any) -> int:
    """File mode: YAML 1.1 reads ``0660`` as octal already; also accept the string ``"0660"``."""
    if isinstance(v, str):
        try:
            v = int(v, 8)
        except ValueError:
            raise c.fail(key, "an octal file mode such as 0660", v) from None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0o777:
        raise c.fail(key, "an octal file mode in 0000..0777 such as 0660", v)
    return v


def _mapping(c: _Checker, data: Any, where: str, cls: type) -> dict[str, Any]:
    """Check ``data`` is a mapping whose keys all belong to ``cls``; suggest fixes for typos."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise c.fail(where or "<top>", "a mapping of keys", data)
    names = [f.name for f in fields(cls) if f.name != "source"]
    for key in data:
        if not isinstance(key, str) or key not in names:
            hint = _suggest(str(key), where, names)
            expected = "a known key" + (f" (did you mean '{hint}'?)" if hint else "")
            expected += f"; known keys here: {', '.join(names)}"
            full = f"{where}.{key}" if where else str(key)
            raise ConfigError(c.file, full, expected)
    return data


def _check_token(
    c: _Checker, section: str, cfg: MetricsConfig | TelemetryConfig, listen: str | None
) -> None:
    """The token rule of an HTTP endpoint (``metrics``, ``telemetry``): visible ASCII, token or
    token_file (absolute) but not both, and one of them when ``listen`` (None = not served) is
    not a loopback address."""
    if cfg.token is not None and not (
        cfg.token.isascii() and cfg.token.isprintable() and " " not in cfg.token
    ):
        # HTTP headers arrive as latin-1: a non-ASCII token could never match
        raise c.fail(f"{section}.token", "visible ASCII characters only", "<hidden>")
    if cfg.token and cfg.token_file:
        raise c.fail(
            f"{section}.token_file",
            f"either {section}.token or {section}.token_file, not both",
            cfg.token_file,
        )
    if cfg.token_file is not None and not os.path.isabs(cfg.token_file):
        raise c.fail(f"{section}.token_file", "an absolute path", cfg.token_file)
    if listen is not None and not (cfg.token or cfg.token_file):
        host, _ = parse_listen(listen)
        if not is_loopback(host):
            raise ConfigError(
                c.file,
                f"{section}.token",
                f"a bearer token (or {section}.token_file) because {section}.listen {listen!r} "
                "is not a loopback address",
            )


def parse_config(data: Any, file: str = "<config>") -> Config:
    """Build a :class:`Config` from parsed YAML, validating every key."""
    c = _Checker(file)
    top = _mapping(c, data, "", Config)
    d = Config()
    get = top.get

    th = _mapping(c, get("thermal"), "thermal", ThermalConfig)
    caps_raw = th.get("cap_khz")
    caps: dict[str, int] = {}
    if caps_raw is not None:
        if not isinstance(caps_raw, dict):
            raise c.fail("thermal.cap_khz", "a mapping cluster name -> kHz (or {})", caps_raw)
        for name, khz in caps_raw.items():
            if not isinstance(name, str):
                raise c.fail("thermal.cap_khz", "cluster names as keys", name)
            caps[name] = c.int_(f"thermal.cap_khz.{name}", khz, lo=1)
    thermal = ThermalConfig(
        margin_c=c.float_("thermal.margin_c", th.get("margin_c", d.thermal.margin_c), 0.0, 50.0),
        cap_khz=caps,
    )

    so = _mapping(c, get("socket"), "socket", SocketConfig)
    socket = SocketConfig(
        path=c.abspath("socket.path", so.get("path", d.socket.path)),
        group=c.str_("socket.group", so.get("group", d.socket.group), optional=True),
        mode=_mode(c, "socket.mode", so.get("mode", d.socket.mode)),
    )
    if socket.mode & 0o600 != 0o600:
        raise c.fail(
            "socket.mode",
            "a mode that lets the owner (root) read and write, e.g. 0660",
            oct(socket.mode),
        )

    lg = _mapping(c, get("logging"), "logging", LoggingConfig)
    logging_cfg = LoggingConfig(
        level=c.choice("logging.level", lg.get("level", d.logging.level), LOG_LEVELS, fold=True),
        format=c.choice("logging.format", lg.get("format", d.logging.format), LOG_FORMATS),
    )

    me = _mapping(c, get("metrics"), "metrics", MetricsConfig)
    metrics = MetricsConfig(
        enabled=c.bool_("metrics.enabled", me.get("enabled", d.metrics.enabled)),
        listen=c.listen("metrics.listen", me.get("listen", d.metrics.listen)),
        token=c.token("metrics.token", me.get("token")),
        token_file=c.str_("metrics.token_file", me.get("token_file"), optional=True),
    )
    # a disabled endpoint binds nothing: its listen address needs no token
    _check_token(c, "metrics", metrics, metrics.listen if metrics.enabled else None)

    te = _mapping(c, get("telemetry"), "telemetry", TelemetryConfig)
    telemetry = TelemetryConfig(
        listen=c.listen("telemetry.listen", te.get("listen"), optional=True),
        token=c.token("telemetry.token", te.get("token")),
        token_file=c.str_("telemetry.token_file", te.get("token_file"), optional=True),
    )
    _check_token(c, "telemetry", telemetry, telemetry.listen)
    if metrics.enabled and telemetry.listen is not None:
        _check_distinct_ports(c, metrics.listen, telemetry.listen)

    mc = _mapping(c, get("mixed_criticality"), "mixed_criticality", MixedCriticalityConfig)
    mixed = MixedCriticalityConfig(
        reserve=c.bool_("mixed_criticality.reserve", mc.get("reserve", d.mixed_criticality.reserve))
    )

    sh = _mapping(c, get("shield"), "shield", ShieldConfig)
    shield = ShieldConfig(
        adaptive=c.bool_("shield.adaptive", sh.get("adaptive", d.shield.adaptive)),
        gamma=c.float_("shield.gamma", sh.get("gamma", d.shield.gamma), 1e-6, 1.0),
    )

    board = c.str_("board", get("board", d.board), optional=True)
    if board is not None:
        is_file = board.endswith((".yaml", ".yml"))
        if (is_file and not os.path.isabs(board)) or (not is_file and board not in board_names()):
            raise c.fail(
                "board",
                f"null (detect), a shipped board ({', '.join(board_names())}) or an absolute path to a board spec .yaml",
                board,
            )

    return Config(
        period_ms=c.int_("period_ms", get("period_ms", d.period_ms), lo=1, hi=60_000),
        policy=c.choice("policy", get("policy", d.policy), POLICIES),
        board=board,
        deadline_slack=c.float_(
            "deadline_slack", get("deadline_slack", d.deadline_slack), 0.0, 1.0, hi_open=True
        ),
        profiles=c.abspath("profiles", get("profiles", d.profiles)),
        thermal=thermal,
        socket=socket,
        state_dir=c.abspath("state_dir", get("state_dir", d.state_dir)),
        logging=logging_cfg,
        metrics=metrics,
        telemetry=telemetry,
        mixed_criticality=mixed,
        shield=shield,
        recheck_each_tick=c.bool_(
            "recheck_each_tick", get("recheck_each_tick", d.recheck_each_tick)
        ),
        source=file,
    )


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load and validate the config.

    ``path=None`` means the default ``/etc/hidvfs/config.yaml``; when that file is absent the
    defaults apply. A path given explicitly must exist.
    """
    explicit = path is not None
    file = os.fspath(path) if explicit else DEFAULT_PATH
    try:
        data = read_yaml(file, ConfigError, ConfigSyntaxError)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(file, "<file>", "an existing config file (no such file)") from None
        return Config()
    return parse_config(data, file)


def read_token(cfg: MetricsConfig | TelemetryConfig, section: str = "telemetry") -> str | None:
    """The bearer token of an HTTP endpoint (config section ``section``: ``telemetry`` or
    ``metrics``), from the config or its token file (stripped)."""
    key = f"{section}.token_file"
    if cfg.token:
        return cfg.token
    if cfg.token_file:
        try:
            with open(cfg.token_file, encoding="utf-8") as f:
                mode = os.fstat(f.fileno()).st_mode & 0o777
                token = f.read().strip()
        except OSError as err:
            raise ConfigError(
                cfg.token_file, key, f"a readable token file ({err.strerror})"
            ) from None
        if mode & 0o077:  # a secret others can read is no secret (as ssh refuses such keys)
            raise ConfigError(
                cfg.token_file,
                key,
                f"a file only its owner can read (chmod 600 {cfg.token_file})",
                f"mode {mode:04o}",
            )
        if not token:
            raise ConfigError(cfg.token_file, key, "a file holding a non-empty token")
        return token
    return None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the config (for ``status`` output and round trips)."""
    out: dict[str, Any] = {}
    for f in fields(cfg):
        if f.name == "source":
            continue
        v = getattr(cfg, f.name)
        out[f.name] = (
            config_to_dict(v) if is_dataclass(v) else (dict(v) if isinstance(v, dict) else v)
        )
    return out


def policy_options(cfg: Config, policy: str | None = None) -> dict[str, Any]:
    """Options the config passes to the factory of ``policy`` (default: the config's own;
    only hidvfs takes any)."""
    if (policy or cfg.policy) == "hidvfs" and cfg.shield.adaptive:
        return {"adaptive_gamma": cfg.shield.gamma}
    return {}
