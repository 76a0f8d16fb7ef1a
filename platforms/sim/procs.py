"""Process control on the simulator: jobs are the plant's processes (pids from 10000).

A job is alive from its release until its last task finishes, like a process from exec to exit.
Invalid requests fail as the live implementation does: an unknown or finished pid raises
:class:`~platforms.procs.ProcessGone`; an empty or fully offline CPU set or an out-of-range
priority raises ValueError.
"""

from __future__ import annotations

from platforms.procs import ProcessControl, ProcessGone
from platforms.sim.plant import Plant


class SimProcessControl(ProcessControl):
    def __init__(self, plant: Plant):
        self.plant = plant

    def __repr__(self) -> str:
        return f"SimProcessControl({self.plant.spec.name})"

    def _live(self, pid: int):
        st = self.plant.jobs.get(pid)
        if st is None or not st.released or st.done:
            raise ProcessGone(pid)
        return st

    def alive(self, pid: int) -> bool:
        st = self.plant.jobs.get(pid)
        return st is not None and st.released and not st.done

    def set_affinity(self, pid: int, cpus: tuple[int, ...]) -> None:
        self._live(pid)
        self.plant.set_affinity(pid, cpus)

    def get_affinity(self, pid: int) -> tuple[int, ...]:
        return tuple(self._live(pid).cpus)

    def set_priority(self, pid: int, rt_priority: int = 0, nice: int = 0) -> None:
        self._live(pid)
        self.plant.set_priority(pid, rt_priority, nice)

    def cpu_time(self, pid: int) -> float:
        self._live(pid)
        return self.plant.job_cpu_time(pid)
