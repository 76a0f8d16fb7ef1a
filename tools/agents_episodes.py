"""The simulated episodes the agents are trained and evaluated on: the BOTS kernels a mix
draws from, its jobs and deadlines (:func:`episode_items`), whether it starts on a hot board
(:func:`thermal_start`), and the runner that plays one mix under a policy
(:func:`make_runner`).

This module is the glue the layering asks for: the learners in ``agents/`` take the episode
runner and the workload generator as arguments; here they are :func:`daemon.simrun.run_sim`
and :func:`bots_bench.workload.default_items`. It stands apart from the commands
(:mod:`tools.cmd_agents`) because training, evaluation and the tests build episodes without
click; it imports neither the commands nor the evaluation (:mod:`tools.agents_eval`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: kernels whose `test`-class reference makespan (50-500 ms) leaves a 50 ms control loop room
#: to act on a 1.5x deadline; the sub-10 ms kernels (floorplan, knapsack, nqueens, sparselu,
#: strassen) finish before a second decision could be taken
EPISODE_KERNELS = ("fib", "sort", "fft", "health", "uts", "alignment", "concom")


@dataclass(frozen=True)
class EpisodeSpec:
    n_jobs: int = 5
    cls: str = "test"
    load: float = 0.6
    slack: float = 1.5
    deadline_fraction: float = 0.7
    hi_fraction: float = 0.2
    period_s: float = 0.05
    #: share of the mixes that start on a hot board (:func:`thermal_start`); eval's default
    #: is 0 (every board idle at 25 C), training's :data:`TRAIN_HOT_FRACTION`
    hot_fraction: float = 0.0


#: training mixes on a hot board: without them no CPU zone passed 0.4 x its trip (C), the
#: thermal agent's choice was never free, and its network kept its initial weights. 0.1, not
#: 0.25: at 0.25 the orin-nx profiler carried the slowing a hot board rewards over to cold
#: lone jobs (4.3 % slower than maxfreq) and rubikpi3's shield grew (agents/TRAINING-LOG.md)
TRAIN_HOT_FRACTION = 0.1
#: a hot mix: ambient drawn from this range (C), and the board soaked at a temperature drawn
#: from [HOT_START_LO x trip, trip - HOT_START_BELOW_TRIP_C] (trip: the lowest passive trip of
#: the CPU zones), where the thermal agent's "take work / must cool" is its own choice (from
#: 0.7 x trip). The top stays 1 C below the thermal guard's default limit (trip - 5 C): a board
#: soaked above it stays there for the whole episode (its heat sink's time constant is minutes),
#: and the guard caps every policy alike to its lowest OPP, which teaches nothing
HOT_AMBIENT_C = (25.0, 45.0)
HOT_START_LO = 0.65
HOT_START_BELOW_TRIP_C = 6.0
#: the thermal draw's own stream: a mix's jobs are the same whether it starts hot or not
_HOT_STREAM = 0x7E4A1


def thermal_start(board: str, seed: int, hot_fraction: float) -> tuple[float, float] | None:
    """(ambient C, start C) of mix ``seed`` when it starts on a hot board, None when it starts
    idle at the board's ambient. Seeded: the same mix starts the same way every time."""
    import numpy as np

    from agents.features import BoardScale
    from platforms.spec import load_board

    if hot_fraction <= 0.0:
        return None
    rng = np.random.default_rng([seed, _HOT_STREAM])
    if rng.random() >= hot_fraction:
        return None
    trip = min(BoardScale.of(load_board(board)).trips_c)
    ambient = float(rng.uniform(*HOT_AMBIENT_C))
    start = float(rng.uniform(max(ambient, HOT_START_LO * trip), trip - HOT_START_BELOW_TRIP_C))
    return ambient, start


def episode_items(board: str, seed: int, ep: EpisodeSpec) -> list:
    """A random mix of ``n_jobs`` BOTS jobs with deadlines (slack x reference), seeded; for a
    lone-job validation seed (:func:`agents.train.lone_index`), one job alone on the board
    without a deadline, as the main BOTS campaign runs it (kernel by index, task graph by
    seed)."""
    from agents.train import lone_index
    from bots_bench.reference import measure_reference
    from bots_bench.workload import WorkloadSpec, default_items, lone_item
    from platforms.spec import load_board

    spec = load_board(board)
    k = lone_index(seed)
    if k is not None:
        return [lone_item(spec, EPISODE_KERNELS[k % len(EPISODE_KERNELS)], ep.cls, seed)]
    refs = {k: measure_reference(board, k, ep.cls, 0) for k in EPISODE_KERNELS}
    mean_ref = sum(p.ref_makespan_s for p in refs.values()) / len(refs)
    w = WorkloadSpec(
        duration_s=4.0 * ep.n_jobs * mean_ref / max(ep.load, 1e-3),
        load=ep.load,
        cls=ep.cls,
        deadline_fraction=ep.deadline_fraction,
        hi_fraction=ep.hi_fraction,
        slack=ep.slack,
        kernels=EPISODE_KERNELS,
    )
    return default_items(spec, seed, w)[: ep.n_jobs]


def make_runner(
    board: str,
    ep: EpisodeSpec,
    reserve: bool = False,
    kernel_rates: bool = False,
    rt_cover_rules: bool = False,
):
    """Runs one mix under a policy with its own stages; with ``reserve``, with the stages the
    daemon runs (the policy's planned around the mixed-criticality reservation, then it). The
    plant's seed is the mix's, and so is its thermal start (:func:`thermal_start`; ``cold``:
    idle at the board's ambient whatever the mix draws). Every policy decides every
    ``ep.period_s``; with ``kernel_rates`` a governor that samples the load (``samples_load``)
    decides at its kernel's rate instead: every 50 ms schedutil needed about 13 decisions,
    650 ms, to climb orin-nx's table, and missed 6 x as many deadlines. With
    ``rt_cover_rules`` the decisions are actuated under the real-time cover rules the daemon
    applies on a board (:func:`daemon.simrun.run_sim`)."""
    from agents.mixed import daemon_stages
    from daemon.simrun import run_sim

    def run_episode(policy, items, seed, cold: bool = False):
        stages = list(getattr(policy, "stages", []) or [])
        hot = None if cold else thermal_start(board, seed, ep.hot_fraction)
        period = ep.period_s
        if kernel_rates and getattr(policy, "samples_load", False):
            period = None  # run_sim: the policy's own, as a BOTS campaign runs it (>= 5 ms)
        return run_sim(
            board,
            policy,
            items,
            seed=seed,
            period_s=period,
            stages=daemon_stages(stages) if reserve else stages,
            ambient_c=None if hot is None else hot[0],
            start_c=None if hot is None else hot[1],
            rt_cover_rules=rt_cover_rules,
        )

    return run_episode
