"""Feeds a simulated workload into the daemon's job table, as `hidvfs run` would on a board.

Jobs are submitted to the plant up front (each with its release time); a job is registered in
the table once the plant has released it, with its reference profile so the gate and the shield
can reason about its deadline.
"""

from __future__ import annotations

from daemon.jobs import JobEntry, JobTable
from platforms.observation import JobProfile
from platforms.sim.plant import Plant, SimJob


class SimFeeder:
    def __init__(
        self, plant: Plant, table: JobTable, items: list[tuple[SimJob, JobProfile | None]]
    ):
        self.plant = plant
        self.table = table
        self.pending: list[tuple[int, SimJob, JobProfile | None]] = []
        for job, prof in sorted(items, key=lambda x: x[0].release_t):
            pid = plant.submit(job)
            self.pending.append((pid, job, prof))
        self._i = 0
        self.submitted = len(self.pending)

    def __call__(self, t: float) -> None:
        while self._i < len(self.pending) and self.pending[self._i][1].release_t <= t + 1e-12:
            pid, job, prof = self.pending[self._i]
            self.table.register(
                JobEntry(
                    pid=pid,
                    name=job.name,
                    release_t=job.release_t,
                    deadline_s=job.deadline_s,
                    criticality=job.criticality,
                    profile=prof,
                )
            )
            self._i += 1

    @property
    def exhausted(self) -> bool:
        return self._i >= len(self.pending)

    def progress(self, pid: int) -> float | None:
        """Share of the job's work done (what JobObs.progress means); not the share of its
        tasks, which runs far off the work on DAGs of uneven tasks (fft: 5 % of the tasks
        done at a quarter of the work)."""
        if pid not in self.plant.jobs:
            return None
        return self.plant.job_progress(pid)
