"""Board detection and discovery: what a live or fake tree offers, as a :class:`BoardSpec`.

:func:`detect_board` follows ``boards.md`` section 7: the NUL-separated device-tree
``compatible`` list first, then ``model``, against every shipped spec's ``detect`` lists.
:func:`probe` builds the spec from the tree itself (cpufreq policies, thermal zones by type,
INA3221 rails by label), borrowing only names, core types and capacities from the matched spec,
so an unknown board still gets a usable spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from platforms import cpufreq, paths, power, thermal
from platforms.errors import SysfsUnavailable
from platforms.spec import (
    BoardSpec,
    ClusterSpec,
    RailSpec,
    Trip,
    ZoneSpec,
    board_names,
    load_board,
)
from platforms.sysfs import SysfsBackend

# -- detection --------------------------------------------------------------------------------


def read_compatible(sysfs: SysfsBackend) -> tuple[str, ...]:
    text = sysfs.read_or(paths.DT_COMPATIBLE, "") or ""
    return tuple(x.strip() for x in text.split("\x00") if x.strip())


def read_model(sysfs: SysfsBackend) -> str | None:
    text = sysfs.read_or(paths.DT_MODEL)
    if text is None:
        return None
    return text.replace("\x00", "").strip() or None


def _shipped_specs() -> list[BoardSpec]:
    return [load_board(n) for n in board_names()]


def match_score(spec: BoardSpec, compatible: tuple[str, ...], model: str | None) -> int:
    """2 for a device-tree ``compatible`` hit, +1 for a ``model`` substring hit (0: no match).

    A ``soc_compatible`` entry (the SoC's, shared by every board built on it) counts as a
    compatible hit only when the model confirms it (``boards.md`` section 7): a Fairphone 5 or
    an RB3gen2 carries ``qcom,qcm6490`` / ``qcom,qcs6490`` as a RUBIK Pi 3 does."""
    model_hit = model is not None and any(m.lower() in model.lower() for m in spec.model)
    found = set(compatible)
    board_hit = bool(set(spec.compatible) & found)
    soc_hit = bool(set(spec.soc_compatible) & found)
    score = 2 if board_hit or (soc_hit and model_hit) else 0
    return score + 1 if model_hit else score


def detect_board(sysfs: SysfsBackend, specs: list[BoardSpec] | None = None) -> str | None:
    """Name of the spec the tree matches best (compatible outranks model), or None."""
    compatible, model = read_compatible(sysfs), read_model(sysfs)
    best, best_score = None, 0
    for spec in specs if specs is not None else _shipped_specs():
        score = match_score(spec, compatible, model)
        if score > best_score:
            best, best_score = spec.name, score
    return best


# -- discovery --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    board: str | None  # the detected shipped board, None when unknown
    spec: BoardSpec  # built by discovery from the tree
    #: policy -> {file: writable} for the files a controller writes
    writable: dict[int, dict[str, bool]]
    online: tuple[int, ...]
    policies: dict[int, cpufreq.PolicyState] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: zone type -> why the daemon will not use its reading (EIO, a value in °C), for a zone
    #: no spec describes; a blank or gated reading is a quirk of the zone instead
    zone_problems: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``spec`` uses the board YAML schema, so it loads with ``parse_board``."""
        return {
            "board": self.board,
            "online": list(self.online),
            "writable": {f"policy{p}": w for p, w in sorted(self.writable.items())},
            "policies": {
                f"policy{p}": {
                    "governor": st.governor,
                    "cur_khz": st.cur_khz,
                    "min_khz": st.min_khz,
                    "max_khz": st.max_khz,
                    "affected_cpus": list(st.affected_cpus or ()),
                }
                for p, st in sorted(self.policies.items())
            },
            "notes": list(self.notes),
            "spec": spec_to_dict(self.spec),
        }


def spec_to_dict(spec: BoardSpec) -> dict[str, Any]:
    """A :class:`BoardSpec` in the ``platforms/boards/*.yaml`` schema."""

    def trips(ts: tuple[Trip, ...]) -> list[dict[str, Any]]:
        return [{"temp_mc": t.temp_mc, "type": t.type, "hyst_mc": t.hyst_mc} for t in ts]

    out: dict[str, Any] = {
        "name": spec.name,
        "title": spec.title,
        "detect": {
            "compatible": list(spec.compatible),
            "model": list(spec.model),
            **({"soc_compatible": list(spec.soc_compatible)} if spec.soc_compatible else {}),
        },
        "clusters": [
            {
                "name": c.name,
                "policy": c.policy,
                "cpus": list(c.cpus),
                "core_type": c.core_type,
                "capacity": c.capacity,
                "freqs_khz": list(c.freqs_khz),
                "transition_latency_ns": c.transition_latency_ns,
                "scaling_driver": c.scaling_driver,
                "governors": list(c.governors),
                "modular_governors": list(c.modular_governors),
                "default_governor": c.default_governor,
                "offline_by_default": list(c.offline_by_default),
            }
            for c in spec.clusters
        ],
        "thermal": {
            "zones": [
                {
                    "type": z.type,
                    "role": z.role,
                    "clusters": list(z.clusters),
                    "trips": trips(z.trips),
                    **({"quirk": z.quirk} if z.quirk else {}),
                    **({"aliases": list(z.aliases)} if z.aliases else {}),
                }
                for z in spec.zones
            ]
        },
        "power": {
            "rails": [
                {
                    "name": r.name,
                    "role": r.role,
                    "driver": r.driver,
                    "device": r.device,
                    "channel": r.channel,
                    "unit": r.unit,
                }
                for r in spec.rails
            ]
        },
    }
    if spec.sim:
        out["sim"] = spec.sim
    return out


def _known_cluster(known: BoardSpec | None, policy: int) -> ClusterSpec | None:
    if known is None:
        return None
    return next((c for c in known.clusters if c.policy == policy), None)


def _discover_clusters(
    sysfs: SysfsBackend, known: BoardSpec | None, online: tuple[int, ...], notes: list[str]
) -> tuple[list[ClusterSpec], dict[int, cpufreq.PolicyState]]:
    clusters, states = [], {}
    for p in cpufreq.list_policies(sysfs):
        try:
            st = cpufreq.read_policy(sysfs, p)
        except SysfsUnavailable as err:
            notes.append(str(err))
            continue
        states[p] = st
        no_table = (
            f"{paths.policy_file(p, 'scaling_available_frequencies')}: unavailable (no such file)"
        )
        notes.extend(e for e in st.errors if not (st.synthesized and e == no_table))
        ref = _known_cluster(known, p)
        cpus = st.related_cpus or st.affected_cpus or (p,)
        table = st.freq_table
        if st.synthesized:
            notes.append(f"policy{p}: {_grid_text(st.driver, table)}")
        if not table:
            notes.append(f"policy{p}: no frequency table or cpuinfo bounds; skipped")
            continue
        govs = st.available_governors or ((st.governor,) if st.governor else ())
        if not govs:
            notes.append(f"policy{p}: no governors readable; skipped")
            continue
        default = st.governor if st.governor in govs else govs[0]
        clusters.append(
            ClusterSpec(
                name=ref.name if ref else f"policy{p}",
                policy=p,
                cpus=tuple(sorted(cpus)),
                core_type=ref.core_type if ref else "unknown",
                capacity=ref.capacity if ref else 1.0,
                freqs_khz=table,
                transition_latency_ns=st.transition_latency_ns or 0,
                governors=tuple(govs),
                default_governor=default,
                modular_governors=ref.modular_governors if ref else (),
                scaling_driver=st.driver or "unknown",
                offline_by_default=(
                    ref.offline_by_default if ref else tuple(c for c in cpus if c not in online)
                ),
            )
        )
    # Policies that vanished with their CPUs (TX2 Denver in the default nvpmodel mode).
    seen = {c for cl in clusters for c in cl.cpus}
    if known is not None:
        for ref in known.clusters:
            if ref.policy not in states and not seen.intersection(ref.cpus):
                up = sorted(set(ref.cpus).intersection(online))
                if up:  # online but without cpufreq: not the nvpmodel case, nothing to borrow
                    notes.append(
                        f"policy{ref.policy} ({ref.name}) absent although CPUs {up} are online: "
                        "no cpufreq policy for them"
                    )
                    continue
                notes.append(
                    f"policy{ref.policy} ({ref.name}) absent: CPUs {list(ref.cpus)} offline; "
                    f"taken from the {known.name} spec"
                )
                clusters.append(ref)
                seen.update(ref.cpus)
    orphans = [c for c in cpufreq.present_cpus(sysfs) if c not in seen]
    if orphans:
        notes.append(f"CPUs {orphans} have no cpufreq policy (offline, or no cpufreq driver)")
    return sorted(clusters, key=lambda c: c.policy), states


def _grid_text(driver: str | None, table: tuple[int, ...]) -> str:
    """How a synthesized table (:func:`platforms.cpufreq.frequency_grid`) came about."""
    lo, hi = table[0], table[-1]
    step = cpufreq.grid_step_khz(lo, hi)
    return (
        f"no frequency table (driver {driver or 'unknown'}): a {step // 1000} MHz grid "
        f"from {lo / 1000:g} to {hi / 1000:g} MHz ({len(table)} OPPs)"
    )


#: how a power-gated sensor fails a read (a fake tree makes its ``temp`` a folder)
_GATED = ("(read failed: EAGAIN)", "(read failed: ENODATA)", "(is a directory)")


def _zone_quirk(sysfs: SysfsBackend, info: thermal.ZoneInfo) -> tuple[str | None, str | None]:
    """(quirk, problem) of a zone no spec describes, from one reading as the daemon reads it:
    blank or gated (EAGAIN, ENODATA) is a quirk the daemon rides out; any other reading it
    refuses (EIO, a value in °C, an implausible one) is a problem, worded as it logs it."""
    if thermal.skip_reason(info.type) is not None:
        return ("stuck100" if info.type.upper().startswith("PMIC") else "not-temperature"), None
    _, problem = thermal.read_temp_c(sysfs, info.temp_path)
    if problem is None:
        return None, None
    if problem.endswith("(empty file)"):
        return "blank", None
    if problem.endswith(_GATED):
        return "eagain", None
    return None, problem


def _discover_zones(
    sysfs: SysfsBackend,
    known: BoardSpec | None,
    clusters: tuple[str, ...] = (),
    problems: dict[str, str] | None = None,
) -> list[ZoneSpec]:
    """The tree's zones; a zone the known spec does not describe (by type or alias) takes a
    role from its type, and a CPU zone among them watches every discovered cluster: which
    cores a sensor sits by is not in sysfs, and a guard that links it to none never caps
    anything. Zones keep the tree's type and no aliases: the spec describes this tree.
    ``problems`` gets the readings of such zones that the daemon would refuse."""
    zones = known.zones if known is not None else ()
    known_zones = {a: z for z in zones for a in z.aliases} | {z.type: z for z in zones}
    cluster_names = {c.name for c in known.clusters} if known is not None else set()
    out, seen = [], set()
    for info in thermal.discover_zones(sysfs):
        if info.type in seen:
            continue
        seen.add(info.type)
        ref = known_zones.get(info.type)
        role = ref.role if ref else thermal.guess_zone_role(info.type)
        if ref:
            linked = tuple(c for c in ref.clusters if c in cluster_names)
            quirk = ref.quirk
        else:
            linked = clusters if role == "cpu" else ()
            quirk, problem = _zone_quirk(sysfs, info)
            if problem is not None and problems is not None:
                problems[info.type] = problem
        out.append(
            ZoneSpec(type=info.type, role=role, clusters=linked, trips=info.trips, quirk=quirk)
        )
    return out


def _discover_rails(sysfs: SysfsBackend, known: BoardSpec | None) -> list[RailSpec]:
    known_rails = {r.name: r for r in known.rails} if known is not None else {}
    out, has_total, has_cpu = [], False, False
    for src in power.discover_rails(sysfs):
        ref = known_rails.get(src.name)
        role = ref.role if ref else power.guess_role(src.name, taken_cpu=has_cpu)
        if role == "total" and has_total:
            role = "sub"
        has_total |= role == "total"
        has_cpu |= role == "cpu"
        unit = ref.unit if ref else "mW"  # a known rail keeps its spec's unit
        out.append(RailSpec(src.name, role, src.driver, src.device, src.channel, unit))
    order = list(known_rails)
    return sorted(out, key=lambda r: order.index(r.name) if r.name in order else len(order))


def probe(sysfs: SysfsBackend, specs: list[BoardSpec] | None = None) -> ProbeResult:
    """Detect the board and describe the tree as a :class:`BoardSpec` built by discovery."""
    candidates = specs if specs is not None else _shipped_specs()
    board = detect_board(sysfs, candidates)
    known = next((s for s in candidates if s.name == board), None)
    notes: list[str] = []
    online = cpufreq.online_cpus(sysfs)
    clusters, states = _discover_clusters(sysfs, known, online, notes)
    if not clusters:
        notes.append(f"no cpufreq policy under {paths.CPUFREQ}")
    problems: dict[str, str] = {}
    zones = _discover_zones(sysfs, known, tuple(c.name for c in clusters), problems)
    notes.extend(
        f"thermal zone {t}: {why}; the daemon refuses such a reading" for t, why in problems.items()
    )
    if zones and not any(z.role == "cpu" for z in zones):
        notes.append(
            "no thermal zone is classified as a CPU zone (zones: "
            + ", ".join(f"{z.type} ({z.role})" for z in zones)
            + "): the thermal guard will not act; a board spec (config board:) giving the "
            "CPU zone role cpu and the clusters it watches turns it on"
        )
    rails = _discover_rails(sysfs, known)
    if not rails:
        notes.append("no INA3221 power monitor found: energy is unavailable")
    elif not any(r.role == "total" for r in rails):
        notes.append(
            "no rail is the board's input (a label such as VDD_IN or POM_5V_IN): board "
            "(total) energy is unavailable"
            + "".join(f"; CPU energy is read from {r.name}" for r in rails if r.role == "cpu")
        )
    model = read_model(sysfs)
    spec = BoardSpec(
        name=board or "unknown",
        title=(known.title if known else None) or model or "unknown board",
        compatible=read_compatible(sysfs),
        model=(model,) if model else (),
        clusters=tuple(clusters),
        zones=tuple(zones),
        rails=tuple(rails),
        sim=dict(known.sim) if known else {},
        source=f"probe:{sysfs!r}",
    )
    writable = {
        p: {f: sysfs.writable(paths.policy_file(p, f)) for f in cpufreq.WRITABLE_FILES}
        for p in states
    }
    return ProbeResult(board, spec, writable, online, states, tuple(notes), problems)


def _known(value: object) -> str:
    """A live value, or ``unknown`` for one that could not be read (a note says why): the
    report is for a person, who would read ``None`` as a Python bug, not a missing file."""
    return "unknown" if value is None else str(value)


def _format_live(st: cpufreq.PolicyState) -> str:
    """``governor G, cur F kHz, limits LO-HI``, with ``unknown`` in place of an unread value."""
    cur = "unknown" if st.cur_khz is None else f"{st.cur_khz} kHz"
    if st.min_khz is None and st.max_khz is None:
        limits = "unknown"
    else:
        limits = f"{_known(st.min_khz)}-{_known(st.max_khz)}"
    return f"governor {_known(st.governor)}, cur {cur}, limits {limits}"


def _problem_tag(problem: str | None) -> str:
    """`` [EIO]`` for a failed read (its errno, as the daemon names it), `` [unusable]`` for
    a reading it refuses; the notes say why."""
    if problem is None:
        return ""
    m = re.search(r"read failed: (E[A-Z]+)\)", problem)
    return f" [{m.group(1) if m else 'unusable'}]"


def format_probe(result: ProbeResult) -> str:
    """Human-readable probe report (``hidvfs probe``)."""
    spec = result.spec
    lines = [
        f"board: {result.board or 'unknown (described by discovery)'} - {spec.title}",
        f"online CPUs: {paths.format_cpu_ranges(result.online) or 'none'}",
        "clusters:",
    ]
    for c in spec.clusters:
        st = result.policies.get(c.policy)
        live = _format_live(st) if st else "absent (CPUs offline)"
        w = result.writable.get(c.policy, {})
        ro = [f for f, ok in w.items() if not ok]
        lines.append(
            f"  policy{c.policy} {c.name} ({c.core_type}) cpus {','.join(map(str, c.cpus))}: "
            f"{len(c.freqs_khz)}{' synthesized' if st and st.synthesized else ''} OPPs "
            f"{c.fmin_khz // 1000}-{c.fmax_khz // 1000} MHz, "
            f"driver {c.scaling_driver}"
        )
        lines.append(f"      {live}; governors: {' '.join(c.governors)}")
        if st:
            lines.append(f"      writable: {'all' if not ro else 'not ' + ', '.join(ro)}")
    lines.append(f"thermal zones ({len(spec.zones)}):")
    for z in spec.zones:
        trips = ", ".join(f"{t.temp_mc / 1000:g} {t.type}" for t in z.trips) or "no trips"
        quirk = f" [{z.quirk}]" if z.quirk else _problem_tag(result.zone_problems.get(z.type))
        lines.append(f"  {z.type:<20} {z.role:<6} {trips}{quirk}")
    lines.append("power rails:" if spec.rails else "power rails: none (energy unavailable)")
    for r in spec.rails:
        lines.append(f"  {r.name:<16} {r.role:<5} {r.driver} {r.device} ch{r.channel}")
    for n in result.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
