"""The Linux cpufreq governors as userspace policies: the kernel's rules on the daemon's view.

Each governor maps what a daemon can observe per cluster (busy fraction per CPU, current
frequency, the frequency table, ``scaling_min_freq``/``scaling_max_freq``) to a frequency of
the table inside the limits, and leaves placement to the kernel (every job on every online CPU
at normal priority, :func:`agents.policy.all_cpus_setting`). Running them through the same
actuation path as the learned agents (``userspace`` + ``scaling_setspeed``) makes the
comparison side by side; ``native=True`` additionally names the kernel governor in the
decision, for runs where the actuator hands the cluster to the real kernel governor.

Rules follow ``torvalds/linux:drivers/cpufreq/cpufreq_ondemand.c``, ``cpufreq_conservative.c``,
``cpufreq_governor.c`` and ``kernel/sched/cpufreq_schedutil.c`` (reference/baselines.md
section 1). Where a userspace view must differ from the kernel it is said at the rule.

Sampling periods (``period_s``), by default :data:`DEFAULT_PERIOD_S` = 10 ms:

* ondemand/conservative ``sampling_rate`` = max(2 scheduler ticks, transition delay);
* schedutil ``rate_limit_us`` = the transition delay;
* transition delay (``cpufreq_policy_transition_delay_us``, Linux 4.14-6.7) =
  min(1000 x ``cpuinfo_transition_latency`` in us, 10 ms), 1 ms when the latency is 0.

With the shipped specs this gives 10 ms on TX2 (500 us latency, estimate) and Orin NX
(100 us), and on RUBIK Pi 3 (1 us) 1 ms for schedutil and 8 ms (2 ticks at HZ=250) for
ondemand/conservative. Pass ``spec=`` to :func:`make_governor` to derive them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agents.policy import Decision, Policy, all_cpus_setting
from platforms.observation import ClusterObs, Observation
from platforms.spec import BoardSpec

NAMES = ("performance", "powersave", "ondemand", "conservative", "schedutil", "maxfreq")

#: the typical ondemand sampling rate and the kernel's cap on the default transition delay
DEFAULT_PERIOD_S = 0.010
#: jiffies per second assumed for the 2-tick floor of the dbs sampling rate (arm64 defconfig)
DEFAULT_TICK_HZ = 250
#: a sample is due when at most this fraction of the period is still missing (timer jitter)
_JITTER = 0.5


def transition_delay_s(transition_latency_ns: int | None) -> float:
    """``cpufreq_policy_transition_delay_us`` of Linux 4.14-6.7, in seconds.

    Later kernels changed the rule twice (2 ms cap in 6.8/6.9; 1.5 x latency capped at 10 ms
    since 6.10); the 4.14-6.7 rule is the one the shipped BSP kernels (4.9 aside) use.
    """
    if transition_latency_ns is None:
        return DEFAULT_PERIOD_S
    if transition_latency_ns < 0:
        raise ValueError(f"transition latency must be >= 0 ns, got {transition_latency_ns}")
    latency_us = transition_latency_ns // 1000
    if latency_us == 0:
        return 0.001
    return min(latency_us * 1000, 10_000) / 1e6


def dbs_sampling_rate_s(transition_latency_ns: int | None, tick_hz: int = DEFAULT_TICK_HZ) -> float:
    """Default ``sampling_rate`` of ondemand/conservative: max(2 ticks, transition delay)."""
    if tick_hz <= 0:
        raise ValueError(f"tick_hz must be > 0, got {tick_hz}")
    return max(2.0 / tick_hz, transition_delay_s(transition_latency_ns))


# --------------------------------------------------------------------------------------------
# Table helpers (pure)


@dataclass(frozen=True)
class ClusterView:
    """The part of a cluster a governor reasons on: table, effective limits, allowed entries."""

    table: tuple[
        int, ...
    ]  # full table, ascending (cpuinfo_min = table[0], cpuinfo_max = table[-1])
    lo: int  # scaling_min_freq (table[0] when unavailable)
    hi: int  # scaling_max_freq (table[-1] when unavailable)
    allowed: tuple[int, ...]  # table entries within [lo, hi], never empty

    @classmethod
    def of(cls, cl: ClusterObs) -> ClusterView | None:
        table = tuple(sorted(set(cl.freqs_khz)))
        if not table:
            # No table exposed: the known limits are the only frequencies we can vouch for.
            table = tuple(sorted({f for f in (cl.min_khz, cl.max_khz, cl.cur_khz) if f}))
            if not table:
                return None
        hi = cl.max_khz if cl.max_khz is not None else table[-1]
        lo = cl.min_khz if cl.min_khz is not None else table[0]
        lo = min(lo, hi)  # the kernel clamps min to max
        allowed = tuple(f for f in table if lo <= f <= hi)
        if not allowed:
            # Limits fall between two OPPs: the effective top OPP is the highest entry <= max.
            below = [f for f in table if f <= hi]
            allowed = (below[-1] if below else table[0],)
        return cls(table, lo, hi, allowed)

    def relation_l(self, khz: float) -> int:
        """CPUFREQ_RELATION_L within the limits: lowest allowed entry >= target."""
        for f in self.allowed:
            if f >= khz:
                return f
        return self.allowed[-1]

    def relation_h(self, khz: float) -> int:
        """CPUFREQ_RELATION_H within the limits: highest allowed entry <= target."""
        best = self.allowed[0]
        for f in self.allowed:
            if f <= khz:
                best = f
        return best

    def relation_c(self, khz: float) -> int:
        """CPUFREQ_RELATION_C within the limits: closest allowed entry, the lower one on a tie."""
        best = self.allowed[0]
        for f in self.allowed:
            if f <= khz:
                best = f
            else:
                return f if f - khz < khz - best else best
        return best

    def apply_limits(self, khz: int) -> int:
        """What ``cpufreq_policy_apply_limits`` does to a held frequency when limits change."""
        if khz > self.allowed[-1]:
            return self.allowed[-1]
        if khz < self.allowed[0]:
            return self.allowed[0]
        return khz if khz in self.allowed else self.relation_c(khz)


def _load_pct(util: float) -> int:
    """The kernel's integer load: 100 * busy / elapsed, truncated."""
    u = 0.0 if util < 0 else 1.0 if util > 1 else util
    return int(u * 100 + 1e-9)


@dataclass
class _State:
    freq: int
    t: float
    rate_mult: int = 1
    requested: int = 0  # conservative: the unsnapped requested frequency
    down_skip: int = 0
    limits: tuple[int, int] = (0, 0)


# --------------------------------------------------------------------------------------------
# Governors


class _Governor(Policy):
    """Shared plumbing: one target per cluster, all-CPU placement, optional native naming."""

    kernel_name = "userspace"
    #: a governor that samples the load: on a board it decides at its kernel rate (schedutil's
    #: rate limit, ondemand's and conservative's sampling period), not at the agents' period
    samples_load = False

    def __init__(self, *, period_s: float | None = None, native: bool = False):
        self.period_s = DEFAULT_PERIOD_S if period_s is None else period_s
        self.native = native
        self._state: dict[str, _State] = {}
        self._checked = False

    def reset(self, seed: int | None = None) -> None:
        self._state.clear()
        self._check()

    def _check(self) -> None:
        if not self.period_s > 0:
            raise ValueError(
                f"The 'period_s' parameter of {type(self).__name__} must be > 0. Got {self.period_s!r} instead."
            )
        self._checked = True

    def decide(self, obs: Observation) -> Decision:
        if not self._checked:
            self._check()
        freqs: dict[str, int] = {}
        events: list[str] = []
        governor: dict[str, str] = {}
        for cl in obs.clusters:
            view = ClusterView.of(cl)
            if view is None:
                events.append(
                    f"{self.name}: cluster {cl.name} exposes no frequency table or limits; left alone"
                )
                continue
            freqs[cl.name] = self._target(cl, view, obs)
            if self.native and self.kernel_name != "userspace":
                if self.kernel_name in cl.governors:
                    governor[cl.name] = self.kernel_name
                else:
                    events.append(
                        f"{self.name}: kernel governor {self.kernel_name!r} not available on {cl.name} "
                        f"(available: {', '.join(cl.governors) or 'unknown'}); emulated in userspace"
                    )
        return Decision(
            freq_khz=freqs, jobs=all_cpus_setting(obs), governor=governor, events=events
        )

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        raise NotImplementedError

    # -- helpers for the sampling governors

    def _due(self, st: _State | None, t: float, interval: float) -> bool:
        if st is None or t < st.t:  # first sample, or a new clock origin
            return True
        return t - st.t >= interval - _JITTER * self.period_s

    def _held(self, cl: ClusterObs, view: ClusterView) -> int:
        """The frequency to keep when no sample is taken: last target, else the current one."""
        st = self._state.get(cl.name)
        if st is not None:
            return view.apply_limits(st.freq)
        if cl.cur_khz is not None:
            return view.apply_limits(cl.cur_khz)
        # Unknown current frequency: the safe side of a DVFS baseline is fast, not slow.
        return view.allowed[-1]


class Performance(_Governor):
    """Highest frequency within ``scaling_max_freq``."""

    name = "performance"
    kernel_name = "performance"

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        return view.allowed[-1]


class Powersave(_Governor):
    """Lowest frequency within ``scaling_min_freq``."""

    name = "powersave"
    kernel_name = "powersave"

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        return view.allowed[0]


class MaxFreq(_Governor):
    """``userspace`` pinned at the table maximum (clamped to ``scaling_max_freq`` like a write)."""

    name = "maxfreq"
    kernel_name = "userspace"

    def __init__(self, *, period_s: float | None = None):
        super().__init__(period_s=period_s, native=False)

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        return view.allowed[-1]


class Ondemand(_Governor):
    """ondemand: above ``up_threshold`` jump to max, else proportional to load.

    load = max over the policy's online CPUs of the busy percentage (integer, as the kernel);
    ``load > up_threshold`` -> ``policy->max`` (RELATION_H) and, if it was below max, the next
    sample waits ``sampling_down_factor`` periods; otherwise
    ``f = cpuinfo_min + load * (cpuinfo_max - cpuinfo_min) / 100`` (integer arithmetic), nearest
    table entry (RELATION_C) within the limits. The kernel's ``up_threshold`` default is 95 on
    kernels with idle micro-accounting (NO_HZ, as the L4T and Qualcomm kernels of the shipped
    boards are) and 80 otherwise; 95 here (baselines.md 1.3), pass 80 for a kernel without. ``powersave_bias``, ``io_is_busy`` and ``ignore_nice_load`` are not modelled
    (their defaults on ARM are 0).
    """

    name = "ondemand"
    kernel_name = "ondemand"
    samples_load = True

    def __init__(
        self,
        up_threshold: int = 95,
        sampling_down_factor: int = 1,
        *,
        period_s: float | None = None,
        native: bool = False,
    ):
        super().__init__(period_s=period_s, native=native)
        self.up_threshold = up_threshold
        self.sampling_down_factor = sampling_down_factor

    def _check(self) -> None:
        super()._check()
        if not 1 <= self.up_threshold <= 100:
            raise ValueError(
                f"The 'up_threshold' parameter of Ondemand must be in [1, 100]. Got {self.up_threshold!r} instead."
            )
        if not 1 <= self.sampling_down_factor <= 100000:
            raise ValueError(
                f"The 'sampling_down_factor' parameter of Ondemand must be in [1, 100000]. Got {self.sampling_down_factor!r} instead."
            )

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        st = self._state.get(cl.name)
        if not self._due(st, obs.t, (st.rate_mult if st else 1) * self.period_s):
            return self._held(cl, view)
        util = cl.max_util
        if util is None:  # unavailable is not idle: keep the frequency, take no sample
            return self._held(cl, view)
        load = _load_pct(util)
        cur = cl.cur_khz if cl.cur_khz is not None else (st.freq if st else None)
        rate_mult = st.rate_mult if st else 1
        if load > self.up_threshold:
            if cur is None or cur < view.hi:
                rate_mult = self.sampling_down_factor
            f = view.relation_h(view.hi)
        else:
            fmin, fmax = view.table[0], view.table[-1]
            target = fmin + load * (fmax - fmin) // 100
            rate_mult = 1
            f = view.relation_c(min(max(target, view.lo), view.hi))
        self._state[cl.name] = _State(freq=f, t=obs.t, rate_mult=rate_mult)
        return f


class Conservative(_Governor):
    """conservative: step ``freq_step`` % of ``scaling_max_freq`` up above 80 % load, down below 20 %.

    Mirrors ``cs_dbs_update``: the governor tracks an unsnapped ``requested_freq`` (so several
    5 % steps may be needed to cross one OPP), raises with RELATION_H, lowers with RELATION_L,
    lowers only every ``sampling_down_factor``-th sample, drops one step per sampling period
    the CPUs spent idle without a sample (``idle_periods``), and ``freq_step = 0`` freezes the
    frequency (a step that rounds to 0 kHz becomes 5 kHz, as in the kernel).
    """

    name = "conservative"
    kernel_name = "conservative"
    samples_load = True

    def __init__(
        self,
        up_threshold: int = 80,
        down_threshold: int = 20,
        freq_step: int = 5,
        sampling_down_factor: int = 1,
        *,
        period_s: float | None = None,
        native: bool = False,
    ):
        super().__init__(period_s=period_s, native=native)
        self.up_threshold = up_threshold
        self.down_threshold = down_threshold
        self.freq_step = freq_step
        self.sampling_down_factor = sampling_down_factor

    def _check(self) -> None:
        super()._check()
        if not 1 <= self.down_threshold < self.up_threshold <= 100:
            raise ValueError(
                "The 'down_threshold'/'up_threshold' parameters of Conservative must satisfy "
                f"1 <= down < up <= 100. Got down={self.down_threshold!r}, up={self.up_threshold!r} instead."
            )
        if not 0 <= self.freq_step <= 100:
            raise ValueError(
                f"The 'freq_step' parameter of Conservative must be in [0, 100]. Got {self.freq_step!r} instead."
            )
        if not 1 <= self.sampling_down_factor <= 10:
            raise ValueError(
                f"The 'sampling_down_factor' parameter of Conservative must be in [1, 10]. Got {self.sampling_down_factor!r} instead."
            )

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        st = self._state.get(cl.name)
        if not self._due(st, obs.t, self.period_s):
            return self._held(cl, view)
        util = cl.max_util
        if util is None:
            return self._held(cl, view)
        held = self._held(cl, view)
        if st is None:  # cs_start: requested_freq = policy->cur
            st = _State(
                freq=held, t=obs.t, requested=cl.cur_khz if cl.cur_khz is not None else held
            )
            elapsed = None
        else:
            elapsed = obs.t - st.t if obs.t >= st.t else None
            st.t = obs.t
        self._state[cl.name] = st
        st.freq = held
        if self.freq_step == 0:
            return held
        lo, hi = view.lo, view.hi
        req = st.requested
        if req > hi or req < lo:  # limits changed meanwhile: restart from the current frequency
            req = cl.cur_khz if cl.cur_khz is not None else held
            st.requested = req
        step = self.freq_step * hi // 100 or 5
        idle_periods = self._idle_periods(cl, elapsed)
        if idle_periods is not None:
            steps = idle_periods * step
            req = req - steps if req > lo + steps else lo
        load = _load_pct(util)
        if load > self.up_threshold:
            st.down_skip = 0
            if req == hi:
                return held
            req = min(req + step, hi)
            st.requested = req
            st.freq = view.relation_h(req)
            return st.freq
        st.down_skip += 1
        if st.down_skip < self.sampling_down_factor:
            return held
        st.down_skip = 0
        if load < self.down_threshold:
            if req == lo:
                return held
            req = req - step if req > step else lo
            st.requested = req
            st.freq = view.relation_l(max(req, lo))
        return st.freq

    def _idle_periods(self, cl: ClusterObs, elapsed: float | None) -> int | None:
        """Whole sampling periods a CPU spent idle, when more than two (``dbs_update``)."""
        if elapsed is None or elapsed <= 2 * self.period_s:
            return None
        periods = None
        for cpu, u in zip(cl.cpus, cl.util):
            if u is None or cpu not in cl.online:
                continue
            idle = (1.0 - min(max(u, 0.0), 1.0)) * elapsed
            if idle > 2 * self.period_s:
                p = int(idle / self.period_s + 1e-9)
                periods = p if periods is None else min(periods, p)
        return periods


class Schedutil(_Governor):
    """schedutil: ``f = 1.25 * cpuinfo_max * util_inv``, lowest table entry >= f, rate-limited.

    The kernel feeds frequency-invariant PELT utilisation (util scaled by f_cur/f_max), so
    ``f_0`` is the maximum frequency. The daemon observes the plain busy fraction at the current
    frequency, so it is made invariant first (``util_inv = busy * f_cur / f_max``, which makes the
    rule equal to the non-invariant form 1.25 * f_cur * busy); pass ``util_is_invariant=True``
    when the backend already reports invariant utilisation. util is the maximum over the policy's
    online CPUs (``sugov_next_freq_shared``). A job the observation shows at an RT priority on
    the cluster sends it to max, as RT tasks do. The rate limit is ``period_s``; a change of the
    limits bypasses it (``need_freq_update``). PELT's ~32 ms decay, the IO-wait boost and the
    Energy-Model skipping of inefficient OPPs are not modelled (the busy fraction over the
    window stands for PELT).
    """

    name = "schedutil"
    kernel_name = "schedutil"
    samples_load = True

    def __init__(
        self,
        *,
        period_s: float | None = None,
        util_is_invariant: bool = False,
        native: bool = False,
    ):
        super().__init__(period_s=period_s, native=native)
        self.util_is_invariant = util_is_invariant

    def _target(self, cl: ClusterObs, view: ClusterView, obs: Observation) -> int:
        st = self._state.get(cl.name)
        limits = (view.lo, view.hi)
        if st is not None and st.limits == limits and not self._due(st, obs.t, self.period_s):
            return self._held(cl, view)
        if _rt_job_on(cl, obs):
            f = view.allowed[-1]
        else:
            util = cl.max_util
            if util is None:
                return self._held(cl, view)
            util = min(max(util, 0.0), 1.0)
            fmax = view.table[-1]
            if not self.util_is_invariant:
                cur = cl.cur_khz if cl.cur_khz is not None else (st.freq if st else fmax)
                util = util * cur / fmax
            f = view.relation_l(min(max(1.25 * fmax * util, view.lo), view.hi))
        self._state[cl.name] = _State(freq=f, t=obs.t, limits=limits)
        return f


def _rt_job_on(cl: ClusterObs, obs: Observation) -> bool:
    for j in obs.jobs:
        if j.rt_priority > 0 and (not j.cpus or any(c in cl.cpus for c in j.cpus)):
            return True
    return False


_CLASSES: Mapping[str, type[_Governor]] = {
    "performance": Performance,
    "powersave": Powersave,
    "ondemand": Ondemand,
    "conservative": Conservative,
    "schedutil": Schedutil,
    "maxfreq": MaxFreq,
}


def default_period_s(name: str, spec: BoardSpec | None) -> float:
    """The natural period of governor ``name`` on a board (slowest cluster), see the module doc."""
    if spec is None or not spec.clusters:
        return DEFAULT_PERIOD_S
    lat = [c.transition_latency_ns for c in spec.clusters]
    if name == "schedutil":
        return max(transition_delay_s(x) for x in lat)
    if name in ("ondemand", "conservative"):
        return max(dbs_sampling_rate_s(x) for x in lat)
    return DEFAULT_PERIOD_S


def make_governor(name: str, spec: BoardSpec | None = None, **options) -> Policy:
    """Build governor ``name`` (one of :data:`NAMES`); ``spec`` derives the kernel's period."""
    key = name.strip().lower()
    cls = _CLASSES.get(key)
    if cls is None:
        raise ValueError(f"unknown governor {name!r}; known governors: {', '.join(NAMES)}")
    if "period_s" not in options:
        options["period_s"] = default_period_s(key, spec)
    return cls(**options)


__all__ = [
    "NAMES",
    "DEFAULT_PERIOD_S",
    "ClusterView",
    "Performance",
    "Powersave",
    "Ondemand",
    "Conservative",
    "Schedutil",
    "MaxFreq",
    "make_governor",
    "default_period_s",
    "transition_delay_s",
    "dbs_sampling_rate_s",
]
