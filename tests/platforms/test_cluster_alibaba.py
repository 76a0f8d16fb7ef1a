"""Alibaba v2018 batch_task reader and the synthetic generator."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platforms.cluster.alibaba import (
    COLUMNS,
    REF_HZ,
    parse_batch_task,
    parse_task_name,
    read_batch_task,
)
from platforms.cluster.simcluster import NodeSpec, Workload, simulate
from platforms.cluster.synthetic import (
    SyntheticConfig,
    generate_rows,
    synthetic_trace,
    write_batch_task,
)

# The shared sample sits beside the checkout (../shared/data), when present.
SAMPLE = str(
    Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-v2018-dag-sample.csv"
)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("M1", (1, ())),
        ("M2_1", (2, (1,))),
        ("M5_3_4", (5, (3, 4))),
        ("R13_2_3_12", (13, (2, 3, 12))),
        ("J10_7_9_Stg4", (10, (7, 9))),  # non-numeric tokens are ignored
        ("M7_Stg3", (7, ())),
        ("task_Nzg3ODAwNDgzMTAwNTc2NTQ2Mw==", (None, ())),
        ("MergeTask", (None, ())),
    ],
)
def test_parse_task_name(name, expected):
    assert parse_task_name(name) == expected


def test_dag_edges_durations_and_units():
    rows = [
        "M1,1.0,j_1,1,Terminated,100,110,100.0,0.2",
        "M2,1.0,j_1,1,Terminated,100,104,50.0,0.3",
        "R3_1_2,2.0,j_1,1,Terminated,110,130,200.0,0.5",
        "task_abc==,1.0,j_1,1,Terminated,101,103,100.0,0.1",
    ]
    load = parse_batch_task(rows)
    assert not load.issues
    (job,) = load.jobs
    names = [t.name for t in job.tasks]
    r3 = names.index("R3_1_2")
    assert sorted(
        names[p] for p in np.flatnonzero([r3 in job.dag.successors(i) for i in range(4)])
    ) == ["M1", "M2"]
    assert job.dag.npred[names.index("task_abc==")] == 0
    assert job.work_s.tolist() == [10.0, 4.0, 20.0, 2.0]
    assert job.cpu.tolist() == [1.0, 0.5, 2.0, 1.0]
    assert job.arrival == 100
    assert job.tasks[r3].instances == 2


def _good_job(job: str, t0: int = 0) -> list[str]:
    return [
        f"M1,1.0,{job},1,Terminated,{t0},{t0 + 5},100.0,0.2",
        f"R2_1,1.0,{job},1,Terminated,{t0 + 5},{t0 + 9},100.0,0.2",
    ]


@pytest.mark.parametrize(
    "bad_rows, kind, bad_line",
    [
        (
            [
                "R1_2,1.0,j_bad,1,Terminated,0,5,100.0,0.2",
                "R2_1,1.0,j_bad,1,Terminated,0,5,100.0,0.2",
            ],
            "cycle",
            3,
        ),
        (
            [
                "M1,1.0,j_bad,1,Terminated,0,5,100.0,0.2",
                "R2_7,1.0,j_bad,1,Terminated,0,5,100.0,0.2",
            ],
            "dangling-parent",
            4,
        ),
        (
            [
                "M1,1.0,j_bad,1,Terminated,0,5,100.0,0.2",
                "R2_1,1.0,j_bad,1,Terminated,abc,5,100.0,0.2",
            ],
            "bad-row",
            4,
        ),
        (
            ["M1,1.0,j_bad,1,Terminated,0,5,100.0,0.2", "R2_1,1.0,j_bad,1,Terminated,9,5,100.0"],
            "bad-row",
            4,
        ),
        (["M1,1.0,j_bad,1,Terminated,9,5,100.0,0.2"], "bad-row", 3),  # end < start
        (
            ["M1,1.0,j_bad,1,Terminated,0,5,100.0,0.2", "M1,1.0,j_bad,1,Terminated,0,5,100.0,0.2"],
            "duplicate-task",
            4,
        ),
        (["M1,1.0,j_bad,1,Running,0,5,100.0,0.2"], "status", 3),
    ],
)
def test_broken_job_is_reported_and_only_it_skipped(bad_rows, kind, bad_line):
    rows = _good_job("j_a") + bad_rows + _good_job("j_b", 50)
    load = parse_batch_task(rows, source="trace.csv")
    assert [j.name for j in load.jobs] == ["j_a", "j_b"]
    skipped = [i for i in load.issues if i.skipped]
    assert len(skipped) == 1
    issue = skipped[0]
    assert (issue.kind, issue.job, issue.line) == (kind, "j_bad", bad_line)
    text = str(issue)
    assert "trace.csv" in text and f"line {bad_line}" in text and "j_bad" in text


def test_missing_values_are_imputed_not_skipped():
    load = parse_batch_task(["M1,,j_1,1,Terminated,0,5,,"], statuses=None)
    assert len(load.jobs) == 1
    assert load.jobs[0].tasks[0].cpu == 1.0
    assert {i.kind for i in load.issues} == {"imputed"}
    assert not any(i.skipped for i in load.issues)


def test_rows_of_a_job_may_be_interleaved_and_max_jobs():
    rows = [
        "M1,1,j_1,1,Terminated,0,1,100,0.1",
        "M1,1,j_2,1,Terminated,0,1,100,0.1",
        "R2_1,1,j_1,1,Terminated,1,2,100,0.1",
    ]
    load = parse_batch_task(rows)
    assert [len(j.tasks) for j in load.jobs] == [2, 1]
    assert [j.name for j in parse_batch_task(rows, max_jobs=1).jobs] == ["j_1"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_jobs=st.integers(1, 30), load=st.floats(0.2, 2.0))
def test_synthetic_traces_parse_cleanly(seed, n_jobs, load):
    cfg = SyntheticConfig(n_jobs=n_jobs, seed=seed, load=load)
    rows = generate_rows(cfg)
    assert all(len(r.split(",")) == 9 for r in rows)
    tr = parse_batch_task(rows)
    assert tr.issues == []
    assert len(tr.jobs) == n_jobs
    for job in tr.jobs:
        job.dag.topo_order()  # acyclic
        assert (job.work_s >= 1).all()
        assert set(job.cpu.tolist()) <= {0.5, 1.0, 2.0}


def test_synthetic_is_reproducible_and_hits_the_load():
    a = generate_rows(SyntheticConfig(n_jobs=200, seed=3))
    assert a == generate_rows(SyntheticConfig(n_jobs=200, seed=3))
    assert a != generate_rows(SyntheticConfig(n_jobs=200, seed=4))
    cfg = SyntheticConfig(n_jobs=400, seed=5, load=0.8, capacity=20.0)
    tr = synthetic_trace(cfg)
    work = sum(float((j.work_s * j.cpu).sum()) for j in tr.jobs)
    span = max(j.arrival for j in tr.jobs) - min(j.arrival for j in tr.jobs)
    assert 0.6 < work / span / cfg.capacity < 1.05
    sizes = np.array([len(j.tasks) for j in tr.jobs])
    assert sizes.min() >= 1 and np.median(sizes) >= 3


def test_file_roundtrip(tmp_path):
    rows = generate_rows(SyntheticConfig(n_jobs=20, seed=1))
    path = tmp_path / "batch_task.csv"
    write_batch_task(path, rows)
    load = read_batch_task(path)
    assert len(load.jobs) == 20 and load.rows == len(rows)


@pytest.mark.skipif(not os.path.exists(SAMPLE), reason="real trace sample not present")
def test_real_sample_reports_cycles_and_keeps_the_rest():
    load = read_batch_task(SAMPLE)
    kinds = {i.kind for i in load.issues if i.skipped}
    assert "cycle" in kinds
    assert len(load.jobs) > 300
    for issue in load.issues:
        assert issue.line > 0 and issue.job


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ('"M1,1,j_bad,1,Terminated,0,5,100,0.2', "quoting"),  # an unmatched quote
        ("M2_²,1,j_bad,1,Terminated,0,5,100,0.2", "ASCII"),  # str.isdigit() accepts "²"
        ("M1,1,j_bad,1,Terminated,0,1e300,100,0.2", "too large"),  # work would be inf
        ("M1,1,j_bad,1,Terminated,0,5,100," + "9" * 200000, "characters"),  # > csv's limit
        ("M1,1,j_bad,1,Terminated,0,5,100\x00,0.2", "NUL"),
    ],
    ids=["quote", "superscript", "huge-work", "big-field", "nul"],
)
def test_a_damaged_line_skips_its_job_only(bad_line, reason):
    rows = _good_job("j_a") + [bad_line] + _good_job("j_b", 50)
    load = parse_batch_task(rows, source="trace.csv")
    assert [j.name for j in load.jobs] == ["j_a", "j_b"]
    assert [len(j.tasks) for j in load.jobs] == [2, 2]  # the rows after it are all read
    (issue,) = [i for i in load.issues if i.skipped]
    assert (issue.job, issue.line, issue.kind) == ("j_bad", 3, "bad-row")
    assert reason in issue.detail


def test_a_row_of_no_known_job_is_a_counted_warning():
    rows = [
        "M1,1,j_1,1,Terminated,100,110,100,1",
        "M2_1,1,j_1,1,Terminated,110,120,100,1",
        "R3_1,1",  # truncated: its job is unknown
        '"M1',  # a quoted field broken across lines
        'x",1,j_2,1,Terminated,100,110,100,1',
        "M1,1,j_3,1,Terminated,100,110,abc,1",
    ]
    load = parse_batch_task(rows, source="trace.csv")
    assert load.dropped_rows == 2
    dropped = [i for i in load.issues if i.kind == "bad-row" and not i.skipped]
    assert [i.line for i in dropped] == [3, 4] and all(i.warn for i in dropped)
    assert "2 of 9 columns" in dropped[0].detail
    # physical line numbers, not csv records, after the broken quote
    assert {i.job: i.line for i in load.issues if i.skipped} == {"j_2": 5, "j_3": 6}


@pytest.mark.parametrize(
    "cut, why",
    [
        ("R3_1,1", "2 of 9 columns: the line ends before job_name"),
        ("R3_1", "1 of 9 columns: the line ends before job_name"),
        ("R3_1,1,,1,Terminated,110,120,100,1", "the job_name column is empty"),
        ('"R3_1,1', "malformed quoting"),
    ],
    ids=["two-columns", "task-name-only", "empty-job-name", "broken-quote"],
)
def test_a_row_without_a_job_name_is_dropped_and_says_why(cut, why):
    """Task names repeat across jobs and a job's rows need not be adjacent, so a row that
    lost its job_name is given to no job, not to the job of the rows around it (which may
    be another one); the warning gives the line, the reason and those rows' jobs."""
    rows = [
        "M1,1,j_1,1,Terminated,100,110,100,1",
        "M2_1,1,j_1,1,Terminated,110,120,100,1",
        cut,
        "",
        "M1,1,j_2,1,Terminated,100,110,100,1",
    ]
    load = parse_batch_task(rows, source="trace.csv")
    assert [j.name for j in load.jobs] == ["j_1", "j_2"] and load.skipped_jobs == []
    (issue,) = load.issues
    assert (issue.line, issue.job, issue.skipped, issue.warn) == (3, "", False, True)
    assert load.dropped_rows == 1
    text = str(issue)
    assert text.startswith("trace.csv: line 3: job ?: bad-row: no job name (")
    assert why in text and text.endswith("(row dropped)")
    assert "no job is skipped" in text
    assert "nearest rows with a job: line 2 (j_1), line 5 (j_2)" in text


def test_a_cut_last_line_names_the_row_before_only():
    load = parse_batch_task(["M1,1,j_1,1,Terminated,100,110,100,1", "M2_1,1,j_"[:6]])
    (issue,) = load.issues
    assert "task 'M2_1'" in issue.detail
    assert issue.detail.endswith("nearest rows with a job: line 1 (j_1), none after")


def test_a_non_utf8_byte_spoils_its_row_not_the_file(tmp_path):
    path = tmp_path / "batch_task.csv"
    path.write_bytes(
        b"M1,1,j_ok,1,Terminated,100,110,100,1\nM1,1,j_\xff,1,Terminated,100,110,100,1\n"
    )
    load = read_batch_task(path)
    assert [j.name for j in load.jobs] == ["j_ok"]
    (issue,) = load.issues
    assert issue.skipped and issue.line == 2 and "UTF-8" in issue.detail


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_does_not_spoil_the_first_job(tmp_path, gz):
    """An editor's or Excel's UTF-8 BOM made the first task name '\\ufeffM1' and skipped j_1."""
    import gzip

    data = b"\xef\xbb\xbf" + "\n".join(_good_job("j_1") + _good_job("j_2", 50)).encode() + b"\n"
    path = tmp_path / ("batch_task.csv.gz" if gz else "batch_task.csv")
    path.write_bytes(gzip.compress(data) if gz else data)
    load = read_batch_task(path)
    assert [j.name for j in load.jobs] == ["j_1", "j_2"] and not load.issues
    assert load.jobs[0].tasks[0].name == "M1"


@pytest.mark.parametrize(
    "bad",
    ["M" + "9" * 5000, "M2_" + "9" * 5000, "R3_1_" + "7" * 4301 + "_2"],
    ids=["task-id", "parent", "middle-parent"],
)
def test_an_id_of_too_many_digits_skips_its_job_not_the_run(bad):
    """int() refuses over 4300 digits: the ValueError used to abort the whole read."""
    rows = _good_job("j_a") + [f"{bad},1,j_bad,1,Terminated,0,5,100,0.2"] + _good_job("j_b", 50)
    load = parse_batch_task(rows, source="trace.csv")
    assert [j.name for j in load.jobs] == ["j_a", "j_b"]
    (issue,) = load.issues
    assert (issue.kind, issue.job, issue.line, issue.skipped) == ("bad-row", "j_bad", 3, True)
    assert "too many digits" in issue.detail and len(str(issue)) < 200


@pytest.mark.parametrize("name", ["task_Nzg3ODAw==", "MergeTask"])
def test_a_repeated_non_dag_task_is_a_duplicate_as_a_dag_one_is(name):
    """A repeated task_* or MergeTask* name was kept twice (its work run twice)."""
    rows = _good_job("j_a") + [
        f"{name},1,j_bad,1,Terminated,0,5,100,0.2",
        "M1,1,j_bad,1,Terminated,0,5,100,0.2",
        f"{name},1,j_bad,1,Terminated,0,5,100,0.2",
    ]
    load = parse_batch_task(rows + _good_job("j_b", 50), source="trace.csv")
    assert [j.name for j in load.jobs] == ["j_a", "j_b"]
    (issue,) = load.issues
    assert (issue.kind, issue.job, issue.line) == ("duplicate-task", "j_bad", 5)
    assert f"{name!r}" in issue.detail and "line 3" in issue.detail
    # distinct non-DAG names stay independent tasks of one job
    ok = parse_batch_task(
        [f"{name},1,j,1,Terminated,0,5,100,0.2", "task_x,1,j,1,Terminated,0,5,100,0.2"]
    )
    assert not ok.issues and len(ok.jobs[0].tasks) == 2


def test_a_gz_that_is_not_one_or_is_cut_short_is_refused_naming_the_file(tmp_path):
    import gzip

    from platforms.cluster.alibaba import read_batch_task

    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=f"{bad}: not a readable .gz file"):
        read_batch_task(bad)
    data = gzip.compress(b"M1,1,j,1,Terminated,0,10,100,0.5\n" * 200)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"{cut}: not a readable .gz file"):
        read_batch_task(cut)


class _AllAtOnce:
    """Every ready task on the node with most room: on ample nodes, the DAG's own makespan."""

    name = "all-at-once"

    def reset(self, workload, nodes, seed):
        pass

    def place(self, view):
        free = view.free_cpu.copy()
        out = []
        for t in view.ready.tolist():
            k = int(np.argmax(free))
            if free[k] >= view.cpu[t]:
                out.append((t, k))
                free[k] -= view.cpu[t]
        return out


def _replay(jobs) -> float:
    nodes = [NodeSpec(f"n{i}", "ref", 64.0, 1000.0, 1.0) for i in range(4)]
    return simulate(Workload.from_jobs(jobs), nodes, _AllAtOnce()).makespan


# a job as the real trace records it (j_8's shape): every row carries the registration time
REGISTERED = [
    "M1,1.0,j_r,1,Terminated,1000,1010,50.0,0.2",
    "R2_1,1.0,j_r,1,Terminated,1000,1015,50.0,0.2",
    "R3_2,1.0,j_r,1,Terminated,1000,1026,50.0,0.2",
    "M4,3.0,j_r,1,Terminated,1000,1005,50.0,0.2",
    "J5_3_4,1.0,j_r,1,Terminated,1000,1030,50.0,0.2",
    "R6_4,1.0,j_r,1,Terminated,1000,1004,50.0,0.2",  # ends before its parent: no work left
]


def test_a_task_registered_with_its_parents_works_from_their_last_end():
    """cluster.md 1.3: start_time is the registration time (a child has its parent's), and a
    task runs only once its parents are done (1.2). end - start counted every ancestor's run
    again in each child: this 30 s job replayed in 10 + 15 + 26 + 30 = 81 s."""
    (job,) = parse_batch_task(REGISTERED).jobs
    assert job.work_s.tolist() == [10.0, 5.0, 11.0, 5.0, 4.0, 0.0]
    span = max(t.end for t in job.tasks) - job.arrival
    assert span == 30 and _replay([job]) == pytest.approx(span)
    assert [t.duration for t in job.tasks][-2] == 30  # the recorded times are kept as read


def _registered(rows: list[str]) -> list[str]:
    """The rows with every start_time set to its job's first one, as the real trace records."""
    first: dict[str, str] = {}
    for r in rows:
        f = r.split(",")
        first[f[2]] = min(first.get(f[2], f[5]), f[5], key=int)
    out = []
    for r in rows:
        f = r.split(",")
        f[5] = first[f[2]]
        out.append(",".join(f))
    return out


def _workload_arrays(w: Workload) -> dict:
    return {k: np.asarray(v) for k, v in vars(w).items()}


# the held-out (900001-3) and validation (700001-2) seeds of agents.placement.train
@settings(max_examples=20, deadline=None)
@given(
    seed=st.one_of(
        st.integers(0, 10_000), st.sampled_from([700_001, 700_002, 900_001, 900_002, 900_003])
    ),
    n_jobs=st.integers(1, 60),
    load=st.sampled_from([0.6, 0.7, 1.0, 1.2]),
)
def test_synthetic_traces_read_as_with_end_minus_start(seed, n_jobs, load):
    """The generator writes a child's start at its parents' last end, so the work rule leaves
    every synthetic workload (the shipped model's training, validation and held-out traces)
    bit-identical to end - start; registration-time starts, as in the real trace, read the
    same too."""
    rows = generate_rows(SyntheticConfig(n_jobs=n_jobs, seed=seed, load=load))
    load_ = parse_batch_task(rows)
    for job in load_.jobs:
        by_id = {t.tid: t for t in job.tasks}
        for t in job.tasks:
            ready = max([by_id[p].end for p in t.parents], default=job.arrival)
            assert t.start == ready  # the generator's invariant the identity rests on
        old_rule = np.array([t.end - t.start for t in job.tasks]) * REF_HZ
        assert np.array_equal(job.dag.cycles, old_rule)
    w = _workload_arrays(Workload.from_jobs(load_.jobs))
    again = _workload_arrays(Workload.from_jobs(parse_batch_task(_registered(rows)).jobs))
    assert w.keys() == again.keys()
    for k in w:
        assert np.array_equal(w[k], again[k]), k


def test_the_header_of_the_published_subset_is_skipped(tmp_path):
    """selected_DAGs.csv starts with the column names; they used to make a skipped job
    "job_name" (a warning for a row that is not data)."""
    rows = [",".join(COLUMNS)] + _good_job("j_2")
    load = parse_batch_task(rows, source="selected_DAGs.csv")
    assert [j.name for j in load.jobs] == ["j_2"] and not load.issues and load.rows == 2
    # spacing, case, quotes and a byte-order mark (read from a file) make no difference
    odd = ",".join(f" {c.upper()} " if i % 2 else f'"{c.title()}"' for i, c in enumerate(COLUMNS))
    path = tmp_path / "selected_DAGs.csv"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([odd] + _good_job("j_2")).encode() + b"\n")
    load = read_batch_task(path)
    assert [j.name for j in load.jobs] == ["j_2"] and not load.issues and load.rows == 2


@pytest.mark.parametrize(
    "rows, line",
    [
        (_good_job("j_1") + [",".join(COLUMNS)], 3),  # not the first line
        ([",".join(COLUMNS[:8])] + _good_job("j_1"), 1),  # not the nine names
        ([",".join(COLUMNS).replace("plan_mem", "mem")] + _good_job("j_1"), 1),
    ],
    ids=["later-line", "eight-names", "other-name"],
)
def test_only_a_first_line_of_the_column_names_is_a_header(rows, line):
    load = parse_batch_task(rows, source="trace.csv")
    assert [j.name for j in load.jobs] == ["j_1"]
    (issue,) = load.issues
    assert (issue.line, issue.job, issue.kind, issue.skipped) == (line, "job_name", "bad-row", True)


def test_filled_in_values_are_counted():
    """cluster.md 1.3: missing values, impute or drop, *log the count*. They were info notes
    only; the count is of the jobs kept (a skipped job's values reach no replay)."""
    rows = [
        "M1,1.0,j_1,1,Terminated,10,20,,0.2",
        "R2_1,,j_1,1,Terminated,20,30,100,",
        "M1,,j_bad,1,Terminated,10,20,,0.2",
        "R2_7,1,j_bad,1,Terminated,20,30,100,0.2",  # dangling parent: j_bad is skipped
    ]
    load = parse_batch_task(rows)
    assert load.skipped_jobs == ["j_bad"]
    assert load.imputed == 3 and [i.line for i in load.imputed_issues] == [1, 2, 2]
    assert sum(i.kind == "imputed" for i in load.issues) == 5  # every one still noted
    assert parse_batch_task(_good_job("j_1")).imputed == 0


def test_gzip_is_known_by_its_bytes_and_a_tar_archive_is_refused(tmp_path):
    """A gzip file not named .gz read as NUL bytes ("no usable job"); the published
    batch_task.tar.gz was read with its tar header glued to the first row, losing that job."""
    import gzip
    import io
    import tarfile

    from platforms.cluster.alibaba import read_batch_task

    rows = b"M1,1,j_1,1,Terminated,0,10,100,0.5\nM2_1,1,j_1,1,Terminated,10,20,100,0.5\n"
    unnamed = tmp_path / "batch_task.download"
    unnamed.write_bytes(gzip.compress(rows))
    load = read_batch_task(unnamed)
    assert [j.name for j in load.jobs] == ["j_1"] and not load.issues
    for name, mode in (("batch_task.tar.gz", "w:gz"), ("batch_task.tar", "w")):
        archive = tmp_path / name
        with tarfile.open(archive, mode) as tar:
            info = tarfile.TarInfo("batch_task.csv")
            info.size = len(rows)
            tar.addfile(info, io.BytesIO(rows))
        with pytest.raises(ValueError, match=f"{archive}: is a tar archive; extract the CSV"):
            read_batch_task(archive)


def test_a_trace_from_a_pipe_is_read_whole(tmp_path):
    """The file is opened once: a `--trace <(zcat ...)` pipe cannot be opened again."""
    import gzip
    import os
    import threading

    from platforms.cluster.alibaba import read_batch_task

    rows = b"M1,1,j_1,1,Terminated,0,10,100,0.5\nM2_1,1,j_1,1,Terminated,10,20,100,0.5\n"
    for data in (rows, gzip.compress(rows)):
        fifo = tmp_path / "trace.fifo"
        os.mkfifo(fifo)

        def feed(data=data, fifo=fifo):
            with open(fifo, "wb") as f:
                f.write(data)

        t = threading.Thread(target=feed)
        t.start()
        load = read_batch_task(fifo)
        t.join()
        fifo.unlink()
        assert [len(j.tasks) for j in load.jobs] == [2] and not load.issues
