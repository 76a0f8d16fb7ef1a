"""Reference costs of BOTS jobs, measured in the simulator at a reference operating point.

A job's reference makespan is measured once: the job alone on the board, every core of the
reference cluster at its top frequency (the ``maxfreq`` point). Deadlines are then
``slack x reference`` (agents.deadlines). Results are memoised per (board, kernel, class, seed,
variant) and carry a version so a changed model invalidates them.
"""

from __future__ import annotations

from functools import lru_cache

from platforms.observation import JobProfile
from platforms.spec import BoardSpec, load_board

#: 2: C and L at capacity 1.0, as JobProfile defines them; 3: the compute-only and memory-only
#: longest paths (JobProfile.span_cpu_s, span_mem_s) the gate bounds the span at f with
REFERENCE_VERSION = 3


def reference_cluster(spec: BoardSpec):
    """The cluster with the largest compute capacity (cores x capacity x f_max)."""
    return spec.reference_cluster


@lru_cache(maxsize=512)
def measure_reference(
    board: str, kernel: str, cls: str, seed: int = 0, variant: str | None = None
) -> JobProfile:
    """``variant``: the DAG model's (``bots_bench.dags.generate``), None for the default."""
    from bots_bench.dags import generate
    from platforms.sim.plant import Plant, SimJob

    spec = load_board(board)
    dag = generate(kernel, cls, seed=seed, variant=variant)
    ref = reference_cluster(spec)
    plant = Plant(spec, seed=seed, online=spec.cpus, governor="userspace")
    for c in spec.clusters:
        plant.set_freq(c.name, c.fmax_khz)
    pid = plant.submit(SimJob(dag=dag, name=f"{kernel}.{cls}"))
    plant.set_affinity(pid, ref.cpus)
    plant.run_until_idle()
    js = plant.jobs[pid]
    makespan = js.finish_t - js.release_t
    f_hz = ref.fmax_khz * 1e3
    # JobProfile work/span are at the reference frequency on a capacity-1.0 core; callers scale
    # by each cluster's capacity (agents.deadlines, agents.mixed).
    work, span = dag.work_span(f_hz, 1.0)
    span_cpu, span_mem = dag.part_spans(f_hz, 1.0)
    mem = float(dag.mem_s.sum())
    return JobProfile(
        name=f"{kernel}.{cls}",
        work_s=work,
        span_s=span,
        beta=mem / work if work > 0 else 0.0,
        ref_makespan_s=makespan,
        ref_khz=ref.fmax_khz,
        ref_cores=len(ref.cpus),
        version=REFERENCE_VERSION,
        span_cpu_s=span_cpu,
        span_mem_s=span_mem,
    )
