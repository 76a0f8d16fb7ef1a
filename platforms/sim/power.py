"""Per-core power model (models.md section 4): dynamic C·V²·f·activity plus leakage.

- Dynamic: ``P_dyn = cdyn · V² · f_MHz · activity`` with ``cdyn`` in µW/MHz/V² (the DT
  ``dynamic-power-coefficient`` unit). Activity is 1 while computing, ``mem_activity`` while
  stalled on memory and ``idle_activity`` for an idle (WFI) online core.
- Leakage, per online core: ``P_leak(V, T) = leak_w · (V/V_top) · exp(kv (V − V_top)) ·
  exp(kt (T − T_ref))``: exponential in temperature (De Vogeleer et al., arXiv 1404.3381) and
  super-linear in voltage. Offline cores are power-gated and draw nothing.

Everything here is a pure function or a frozen table precomputed per OPP, so the plant's hot path
only multiplies floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from platforms.bounds import PowerCurve
from platforms.sim.params import ClusterPower, SimParams, parse_sim
from platforms.spec import BoardSpec, ClusterSpec


def dyn_w(cdyn_uw_mhz_v2: float, volt_v: float, f_khz: float, activity: float = 1.0) -> float:
    """Dynamic power (W) of one core: C·V²·f·activity."""
    return cdyn_uw_mhz_v2 * 1e-6 * volt_v * volt_v * (f_khz / 1000.0) * activity


def leak_w(cp: ClusterPower, volt_v: float, temp_c: float) -> float:
    """Leakage (W) of one online core at voltage ``volt_v`` and die temperature ``temp_c``."""
    v_top = cp.volt_v[-1]
    return (
        cp.leak_w
        * (volt_v / v_top)
        * math.exp(cp.leak_kv * (volt_v - v_top))
        * math.exp(cp.leak_kt * (temp_c - cp.leak_ref_c))
    )


def task_activity(compute_s: float, mem_s: float, mem_activity: float) -> float:
    """Average switching activity of a task that computes ``compute_s`` and stalls ``mem_s``."""
    total = compute_s + mem_s
    if total <= 0.0:
        return 1.0
    return (compute_s + mem_activity * mem_s) / total


@dataclass(frozen=True)
class ClusterPowerTable:
    """One cluster's power numbers per OPP, precomputed once.

    ``coef_w[k]``: dynamic W of one core at activity 1 at OPP k; ``leak_ref_w[k]``: leakage W of
    one core at OPP k and ``ref_c``; ``leak_w(k, T) = leak_ref_w[k]·exp(kt (T − ref_c))``.
    """

    name: str
    freqs_khz: tuple[int, ...]
    volt_v: tuple[float, ...]
    coef_w: tuple[float, ...]
    leak_ref_w: tuple[float, ...]
    kt: float
    ref_c: float

    @classmethod
    def build(cls, cs: ClusterSpec, cp: ClusterPower) -> ClusterPowerTable:
        coef = tuple(dyn_w(cp.cdyn_uw_mhz_v2, v, f) for f, v in zip(cs.freqs_khz, cp.volt_v))
        leak = tuple(leak_w(cp, v, cp.leak_ref_c) for v in cp.volt_v)
        return cls(cs.name, cs.freqs_khz, cp.volt_v, coef, leak, cp.leak_kt, cp.leak_ref_c)

    def index(self, khz: int) -> int:
        return self.freqs_khz.index(khz)

    def leak_w(self, k: int, temp_c: float) -> float:
        return self.leak_ref_w[k] * math.exp(self.kt * (temp_c - self.ref_c))

    def busy_w(self, k: int, temp_c: float, activity: float = 1.0) -> float:
        """Power of one busy core at OPP k (dynamic at ``activity`` + leakage)."""
        return self.coef_w[k] * activity + self.leak_w(k, temp_c)


def core_power_curve(
    spec: BoardSpec, cluster: str, temp_c: float | None = None, params: SimParams | None = None
) -> PowerCurve:
    """Busy-core power per OPP of ``cluster`` for the energy bounds (platforms.bounds).

    Leakage is taken at ``temp_c`` (default: the ambient, the lowest temperature the plant can
    reach, so the curve stays a valid lower bound of the simulated power).
    """
    params = params or parse_sim(spec)
    cs = spec.cluster(cluster)
    table = ClusterPowerTable.build(cs, params.cluster(cluster))
    t = params.ambient_c if temp_c is None else temp_c
    return PowerCurve(
        freqs_hz=tuple(f * 1e3 for f in cs.freqs_khz),
        power_w=tuple(table.busy_w(k, t) for k in range(len(cs.freqs_khz))),
        capacity=cs.capacity,
    )
