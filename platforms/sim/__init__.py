"""The plant simulator: DVFS, power, RC thermal network and OpenMP-like DAG execution.

``make_sim_platform("tx2")`` gives a :class:`~platforms.platform.Platform` whose sysfs, process
control and clock are the simulated board's; ``platform.sysfs.plant`` is the :class:`Plant`.
"""

from __future__ import annotations

from platforms.clock import VirtualClock
from platforms.platform import Platform
from platforms.sim.plant import History, JobState, Plant, SimJob
from platforms.sim.procs import SimProcessControl
from platforms.sim.simsysfs import SimSysfs
from platforms.spec import BoardSpec, load_board

__all__ = [
    "History",
    "JobState",
    "Plant",
    "SimJob",
    "SimProcessControl",
    "SimSysfs",
    "make_sim_platform",
]


def make_sim_platform(board: str | BoardSpec, seed: int = 0, **plant_kwargs) -> Platform:
    """A simulated board; the clock's ``sleep`` advances the plant and returns early at a job
    release or completion. ``plant_kwargs`` go to :class:`Plant` (ambient_c, start_c, governor,
    online, params)."""
    spec = load_board(board) if isinstance(board, str) else board
    plant = Plant(spec, seed=seed, **plant_kwargs)
    clock = VirtualClock(plant.t, on_advance=plant.advance)
    return Platform(
        spec=spec, sysfs=SimSysfs(plant), procs=SimProcessControl(plant), clock=clock, kind="sim"
    )
