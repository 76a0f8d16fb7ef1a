"""Simulator parameters: the ``sim:`` section of a board spec, parsed and validated.

The spec loader keeps ``sim`` as a raw mapping; this module turns it into frozen dataclasses and
fails with :class:`~platforms.errors.SpecError` naming the file, the key (``sim.<key>``) and what
was expected. Schema (every power/thermal number is per board, with its source or "estimate" noted
in the YAML)::

    sim:
      ambient_c: 25.0              # default ambient temperature
      exec_jitter: 0.02            # lognormal sigma of each task's duration (run-to-run noise)
      mem_activity: 0.35           # switching activity of a core stalled on memory (compute = 1)
      idle_activity: 0.02          # activity of an idle (WFI, clock-gated) online core
      thermal_step_s: 0.01         # internal ZOH step of the RC network
      throttle_period_s: 0.1       # passive polling period of the thermal governor (step_wise)
      history_period_s: 0.1        # down-sampling of Plant.history (0 disables it)
      sensor_resolution_mc: 500    # thermal sensor quantisation (m°C)
      cpu_uncore_w: 0.2            # CPU-rail power of the CPU complex outside the cores
      cpu_uncore_node: soc         # thermal node that receives it
      clusters:
        <cluster name>:
          node: <thermal node>     # die node heated by this cluster
          volt_v: [...]            # one voltage per OPP of the cluster's freqs_khz
          cdyn_uw_mhz_v2: 220      # per-core effective capacitance incl. its L2 share
          leak_w: 0.04             # per online core at leak_ref_c and the top-OPP voltage
          leak_ref_c: 25.0
          leak_kt: 0.025           # 1/K: P_leak ~ exp(kt (T - ref))
          leak_kv: 3.0             # 1/V: P_leak ~ V exp(kv (V - V_top))
          gate_after_s: 0.0018     # optional: an idle core is power-gated (cpuidle's deepest
                                   # core state) once idle this long (the state's min residency);
                                   # absent: idle cores stay in WFI, clock-gated but leaking
          gated_leak: 0.05         # fraction of the core's leakage left while power-gated
      rails:                       # rest of the board: spec sub-rails (and the CPU rail's
        <rail name | other>:       # non-CPU loads); "other" is the unmetered remainder of the total
          {base_w: .., busy_core_w: .., node: ..}
      rail_voltage_mv: {<rail name>: mV}   # bus voltage shown by the sensors (default 5000)
      thermal:
        nodes: [{name, c_j_k, r_amb_k_w (optional)}]
        links: [[a, b, r_k_w], ...]
        zones: {<zone type>: {node: n} | {mix: {n: w, ...}} | {max: [n, ...]}, offset_c: 0}
      dtsfilename: "..."           # optional proc/device-tree/nvidia,dtsfilename
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from platforms.errors import SpecError
from platforms.spec import BoardSpec

_NO_MAP_QUIRKS = ("blank", "eagain", "stuck100", "not-temperature")
_KEYS = {
    "ambient_c",
    "exec_jitter",
    "mem_activity",
    "idle_activity",
    "thermal_step_s",
    "throttle_period_s",
    "history_period_s",
    "sensor_resolution_mc",
    "cpu_uncore_w",
    "cpu_uncore_node",
    "clusters",
    "rails",
    "rail_voltage_mv",
    "thermal",
    "dtsfilename",
}


@dataclass(frozen=True)
class ClusterPower:
    """Per-core power parameters of one cluster (frequency domain)."""

    name: str
    node: str
    volt_v: tuple[float, ...]
    cdyn_uw_mhz_v2: float
    leak_w: float
    leak_ref_c: float
    leak_kt: float
    leak_kv: float
    gate_after_s: float = math.inf  # idle seconds before the core is power-gated (inf: never)
    gated_leak: float = 1.0  # fraction of the leakage left while gated


@dataclass(frozen=True)
class RailLoad:
    """A rest-of-board load: ``base_w`` always, plus ``busy_core_w`` per busy core."""

    name: str
    base_w: float
    busy_core_w: float
    node: str


@dataclass(frozen=True)
class ThermalNode:
    name: str
    c_j_k: float
    r_amb_k_w: float | None = None


@dataclass(frozen=True)
class ThermalLink:
    a: str
    b: str
    r_k_w: float


@dataclass(frozen=True)
class ZoneMap:
    """How a thermal zone reads the network: weighted mix (``mode='mix'``) or max of nodes."""

    type: str
    mode: str  # "mix" | "max"
    nodes: tuple[str, ...]
    weights: tuple[float, ...]
    offset_c: float = 0.0


@dataclass(frozen=True)
class SimParams:
    ambient_c: float
    exec_jitter: float
    mem_activity: float
    idle_activity: float
    thermal_step_s: float
    throttle_period_s: float
    history_period_s: float
    sensor_resolution_mc: int
    cpu_uncore_w: float
    cpu_uncore_node: str
    clusters: tuple[ClusterPower, ...]
    rails: tuple[RailLoad, ...]
    rail_voltage_mv: tuple[tuple[str, int], ...]
    nodes: tuple[ThermalNode, ...]
    links: tuple[ThermalLink, ...]
    zones: tuple[ZoneMap, ...]
    dtsfilename: str | None = None
    source: str = ""

    def cluster(self, name: str) -> ClusterPower:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)

    def voltage_mv(self, rail: str) -> int:
        return dict(self.rail_voltage_mv).get(rail, 5000)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


class _P:
    """Typed access into the ``sim`` mapping with SpecError naming ``sim.<key>``."""

    def __init__(self, file: str):
        self.file = file

    def err(self, key: str, expected: str, got: object = None) -> SpecError:
        return SpecError(self.file, f"sim.{key}", expected, got)

    def mapping(self, d: Any, key: str) -> dict:
        if not isinstance(d, dict):
            raise self.err(key, "a mapping", d)
        return d

    def num(
        self,
        d: dict,
        key: str,
        path: str,
        default: float | None = None,
        *,
        lo=None,
        lo_open=False,
        hi=None,
    ) -> float:
        if key not in d or d[key] is None:
            if default is None:
                raise self.err(path, "a number (missing)")
            return float(default)
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.err(path, "a finite number", v)
        v = float(v)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise self.err(path, f"a number {'>' if lo_open else '>='} {lo}", v)
        if hi is not None and v > hi:
            raise self.err(path, f"a number <= {hi}", v)
        return v

    def name(self, d: dict, key: str, path: str, choices) -> str:
        v = d.get(key)
        if not isinstance(v, str) or v not in choices:
            raise self.err(path, f"one of {list(choices)}", v)
        return v


_CLUSTER_KEYS = {
    "node",
    "volt_v",
    "cdyn_uw_mhz_v2",
    "leak_w",
    "leak_ref_c",
    "leak_kt",
    "leak_kv",
    "gate_after_s",
    "gated_leak",
}


def _power_gating(p: _P, c: dict, w: str) -> dict[str, float]:
    """The optional idle power-gating of a cluster's cores: both keys or neither."""
    if "gate_after_s" not in c:
        if "gated_leak" in c:
            raise p.err(f"{w}.gate_after_s", "a number with gated_leak (missing)")
        return {}
    return {
        "gate_after_s": p.num(c, "gate_after_s", f"{w}.gate_after_s", lo=0.0),
        "gated_leak": p.num(c, "gated_leak", f"{w}.gated_leak", lo=0.0, hi=1.0),
    }


def parse_sim(spec: BoardSpec) -> SimParams:
    """Parse and validate ``spec.sim``; every error names ``sim.<key>`` in the spec's file."""
    file = spec.source or f"<{spec.name}>"
    p = _P(file)
    raw = spec.sim
    if not isinstance(raw, dict) or not raw:
        raise SpecError(
            file, "sim", "a mapping of simulator parameters (missing or empty)", raw or None
        )

    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise p.err(unknown[0], f"a known simulator key ({', '.join(sorted(_KEYS))})")
    # -- thermal network first: the other sections name its nodes ------------------------------
    th = p.mapping(raw.get("thermal"), "thermal")
    raw_nodes = th.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise p.err("thermal.nodes", "a non-empty list of {name, c_j_k, r_amb_k_w}", raw_nodes)
    nodes: list[ThermalNode] = []
    for i, n in enumerate(raw_nodes):
        w = f"thermal.nodes[{i}]"
        n = p.mapping(n, w)
        nm = n.get("name")
        if not isinstance(nm, str) or not nm:
            raise p.err(f"{w}.name", "a node name", nm)
        if nm in (x.name for x in nodes):
            raise p.err(f"{w}.name", "a unique node name", nm)
        r_amb = None
        if n.get("r_amb_k_w") is not None:
            r_amb = p.num(n, "r_amb_k_w", f"{w}.r_amb_k_w", lo=0.0, lo_open=True)
        nodes.append(ThermalNode(nm, p.num(n, "c_j_k", f"{w}.c_j_k", lo=0.0, lo_open=True), r_amb))
    node_names = [n.name for n in nodes]
    links: list[ThermalLink] = []
    for i, lk in enumerate(th.get("links") or []):
        w = f"thermal.links[{i}]"
        if (
            not isinstance(lk, list)
            or len(lk) != 3
            or lk[0] not in node_names
            or lk[1] not in node_names
            or lk[0] == lk[1]
        ):
            raise p.err(w, f"[node, node, r_k_w] with two different nodes of {node_names}", lk)
        r = p.num({"r": lk[2]}, "r", f"{w}[2]", lo=0.0, lo_open=True)
        links.append(ThermalLink(lk[0], lk[1], r))
    if not any(n.r_amb_k_w for n in nodes):
        raise p.err("thermal.nodes", "at least one node with r_amb_k_w (a path to ambient)")

    zones_raw = p.mapping(th.get("zones") or {}, "thermal.zones")
    spec_zone_types = [z.type for z in spec.zones]
    zones: list[ZoneMap] = []
    for ztype, zm in zones_raw.items():
        w = f"thermal.zones.{ztype}"
        if ztype not in spec_zone_types:
            raise p.err("thermal.zones", f"zone types of the spec {spec_zone_types}", ztype)
        zm = p.mapping(zm, w)
        offset = p.num(zm, "offset_c", f"{w}.offset_c", 0.0)
        if "node" in zm:
            if zm["node"] not in node_names:
                raise p.err(f"{w}.node", f"one of {node_names}", zm["node"])
            zones.append(ZoneMap(ztype, "mix", (zm["node"],), (1.0,), offset))
        elif "mix" in zm:
            mix = p.mapping(zm["mix"], f"{w}.mix")
            if not mix or any(k not in node_names for k in mix):
                raise p.err(f"{w}.mix", f"a mapping of nodes from {node_names} to weights", mix)
            ws = [p.num(mix, k, f"{w}.mix.{k}", lo=0.0) for k in mix]
            if abs(sum(ws) - 1.0) > 1e-6:
                raise p.err(f"{w}.mix", "weights that sum to 1", mix)
            zones.append(ZoneMap(ztype, "mix", tuple(mix), tuple(ws), offset))
        elif "max" in zm:
            mx = zm["max"]
            if not isinstance(mx, list) or not mx or any(k not in node_names for k in mx):
                raise p.err(f"{w}.max", f"a non-empty list of nodes from {node_names}", mx)
            zones.append(ZoneMap(ztype, "max", tuple(mx), tuple(1.0 for _ in mx), offset))
        else:
            raise p.err(w, "one of {node: n}, {mix: {n: w}}, {max: [n, ...]}", zm)
    mapped = {z.type for z in zones}
    for z in spec.zones:
        if z.quirk in _NO_MAP_QUIRKS or z.role == "ignore":
            continue
        if z.type not in mapped:
            raise p.err("thermal.zones", f"a mapping for temperature zone {z.type!r}")

    # -- clusters ---------------------------------------------------------------------------
    raw_cl = p.mapping(raw.get("clusters"), "clusters")
    clusters: list[ClusterPower] = []
    for cs in spec.clusters:
        w = f"clusters.{cs.name}"
        if cs.name not in raw_cl:
            raise p.err(w, "power parameters for every cluster of the spec (missing)")
        c = p.mapping(raw_cl[cs.name], w)
        unknown = sorted(set(c) - _CLUSTER_KEYS)
        if unknown:
            raise p.err(
                f"{w}.{unknown[0]}", f"a known cluster key ({', '.join(sorted(_CLUSTER_KEYS))})"
            )
        node = p.name(c, "node", f"{w}.node", node_names)
        volt = c.get("volt_v")
        if (
            not isinstance(volt, list)
            or len(volt) != len(cs.freqs_khz)
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in volt)
            or any(b < a for a, b in zip(volt, volt[1:]))
        ):
            raise p.err(
                f"{w}.volt_v",
                f"{len(cs.freqs_khz)} positive non-decreasing voltages (one per OPP of freqs_khz)",
                volt,
            )
        clusters.append(
            ClusterPower(
                name=cs.name,
                node=node,
                volt_v=tuple(float(v) for v in volt),
                cdyn_uw_mhz_v2=p.num(c, "cdyn_uw_mhz_v2", f"{w}.cdyn_uw_mhz_v2", lo=0.0),
                leak_w=p.num(c, "leak_w", f"{w}.leak_w", lo=0.0),
                leak_ref_c=p.num(c, "leak_ref_c", f"{w}.leak_ref_c", 25.0),
                leak_kt=p.num(c, "leak_kt", f"{w}.leak_kt", 0.0, lo=0.0, hi=0.2),
                leak_kv=p.num(c, "leak_kv", f"{w}.leak_kv", 0.0, lo=0.0),
                **_power_gating(p, c, w),
            )
        )
    extra = sorted(set(raw_cl) - {c.name for c in spec.clusters})
    if extra:
        raise p.err(
            "clusters", f"cluster names of the spec {[c.name for c in spec.clusters]}", extra
        )

    # -- rails ------------------------------------------------------------------------------
    rail_names = [r.name for r in spec.rails if r.role != "total"]
    raw_rails = p.mapping(raw.get("rails") or {}, "rails")
    rails: list[RailLoad] = []
    for rn, rl in raw_rails.items():
        w = f"rails.{rn}"
        if rn != "other" and rn not in rail_names:
            raise p.err("rails", f"'other' or a cpu/sub rail of the spec {rail_names}", rn)
        rl = p.mapping(rl, w)
        rails.append(
            RailLoad(
                name=rn,
                base_w=p.num(rl, "base_w", f"{w}.base_w", lo=0.0),
                busy_core_w=p.num(rl, "busy_core_w", f"{w}.busy_core_w", 0.0, lo=0.0),
                node=p.name(rl, "node", f"{w}.node", node_names),
            )
        )
    missing = [r.name for r in spec.rails if r.role == "sub" and r.name not in raw_rails]
    if missing:
        raise p.err("rails", f"a load for every sub-rail of the spec (missing {missing})")
    volts = p.mapping(raw.get("rail_voltage_mv") or {}, "rail_voltage_mv")
    all_rails = [r.name for r in spec.rails]
    for rn, mv in volts.items():
        if rn not in all_rails:
            raise p.err("rail_voltage_mv", f"rail names of the spec {all_rails}", rn)
        if isinstance(mv, bool) or not isinstance(mv, int) or mv <= 0:
            raise p.err(f"rail_voltage_mv.{rn}", "a positive integer (mV)", mv)

    step = p.num(raw, "thermal_step_s", "thermal_step_s", 0.01, lo=1e-4, hi=1.0)
    uncore_node = clusters[0].node
    if "cpu_uncore_node" in raw:
        uncore_node = p.name(raw, "cpu_uncore_node", "cpu_uncore_node", node_names)
    dts = raw.get("dtsfilename")
    if dts is not None and not isinstance(dts, str):
        raise p.err("dtsfilename", "a string", dts)
    res = raw.get("sensor_resolution_mc", 1)
    if isinstance(res, bool) or not isinstance(res, int) or res < 1:
        raise p.err("sensor_resolution_mc", "a positive integer (m°C)", res)
    return SimParams(
        ambient_c=p.num(raw, "ambient_c", "ambient_c", 25.0, lo=-40.0, hi=150.0),
        exec_jitter=p.num(raw, "exec_jitter", "exec_jitter", 0.0, lo=0.0, hi=1.0),
        mem_activity=p.num(raw, "mem_activity", "mem_activity", 0.35, lo=0.0, hi=1.0),
        idle_activity=p.num(raw, "idle_activity", "idle_activity", 0.02, lo=0.0, hi=1.0),
        thermal_step_s=step,
        throttle_period_s=p.num(raw, "throttle_period_s", "throttle_period_s", 0.1, lo=step),
        history_period_s=p.num(raw, "history_period_s", "history_period_s", 0.1, lo=0.0),
        sensor_resolution_mc=res,
        cpu_uncore_w=p.num(raw, "cpu_uncore_w", "cpu_uncore_w", 0.0, lo=0.0),
        cpu_uncore_node=uncore_node,
        clusters=tuple(clusters),
        rails=tuple(rails),
        rail_voltage_mv=tuple((k, int(v)) for k, v in volts.items()),
        nodes=tuple(nodes),
        links=tuple(links),
        zones=tuple(zones),
        dtsfilename=dts,
        source=file,
    )
