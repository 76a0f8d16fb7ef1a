"""Reader for Alibaba cluster-trace-v2018 ``batch_task.csv``.

Columns: task_name, instance_num, job_name, task_type, status, start_time, end_time, plan_cpu,
plan_mem. The raw trace has no header row; a first line made of exactly these names (the
published subset ``selected_DAGs.csv`` has one) is skipped, any other bad row is refused as
below. The DAG is encoded in the task names: ``M5_3_4`` is task 5 and depends on tasks 3
and 4; the leading letter carries no meaning; non-numeric tokens (``Stg4``) are ignored;
``task_*`` and ``MergeTask*`` names are independent (non-DAG) tasks.

A task's work is ``end_time - max(start_time, its parents' latest end_time)``, at least 0
(:func:`task_work_s`): ``start_time`` is when the task was registered, often together with
its parents, not when it started computing, and a task runs only once all of its parents
are done. An empty ``instance_num``, ``plan_cpu`` or ``plan_mem`` is filled in
(:data:`IMPUTED_DEFAULTS`), noted per value and counted (``imputed``).

A broken job (a cycle, a parent that does not exist, a bad row, a status other than the
accepted ones) is reported with the file, the line and the job, and only that job is skipped.
Each physical line is one record (no field of the schema holds a line break), so a damaged line
(an unmatched quote, a field past 131072 characters, bytes that are not UTF-8, a NUL) spoils
itself only; a bad row whose job cannot be told is reported and counted (``dropped_rows``).
A row without a job name (a line cut before the job_name column, or that column empty) is
given to no job: task names (``M1``, ``R2_1``) repeat across jobs and a job's rows need not be
adjacent, so the rows around it do not tell its job (they may be another job's). Its warning
says so and names the jobs of the nearest rows before and after it, for the reader to judge.
Units: times in seconds from the trace start, ``cpu`` in cores (plan_cpu / 100), ``mem`` in the
trace's normalised units (0-100).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from platforms.dag import DAG, make_dag
from platforms.streams import sniff_gzip

#: the schema's column names, in order (the header of the published subset, lower-cased)
COLUMNS = (
    "task_name",
    "instance_num",
    "job_name",
    "task_type",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
)
N_COLUMNS = len(COLUMNS)
#: the csv module's default field limit; no field of the schema comes near it
FIELD_LIMIT = 131072
_DIGITS = frozenset("0123456789")
#: ``DAG.cycles`` holds the work as cycles at this frequency on a capacity-1 core, so that
#: ``dag.task_time(REF_HZ)`` is the task's duration in seconds on the reference node.
REF_HZ = 1e9
DEFAULT_STATUSES = ("Terminated",)
#: what an empty value is filled in with (a single instance, one core, no memory)
IMPUTED_DEFAULTS = {"instance_num": 1.0, "plan_cpu": 100.0, "plan_mem": 0.0}


@dataclass(frozen=True)
class TraceTask:
    name: str  # raw task_name
    tid: int  # numeric id inside the job (fresh ids above the DAG ids for task_* names)
    parents: tuple[int, ...]
    instances: int
    status: str
    start: float
    end: float
    cpu: float  # cores
    mem: float  # normalised memory units
    line: int

    @property
    def duration(self) -> float:
        """end - start as recorded: from registration, so it may include the parents' run
        (the work is :func:`task_work_s`)."""
        return self.end - self.start


@dataclass(frozen=True, eq=False)
class TraceJob:
    """One job: its tasks (index = DAG node) and the DAG built from the names."""

    name: str
    tasks: tuple[TraceTask, ...]
    dag: DAG

    @property
    def arrival(self) -> float:
        return min(t.start for t in self.tasks)

    @property
    def work_s(self) -> np.ndarray:
        return self.dag.task_time(REF_HZ)

    @property
    def cpu(self) -> np.ndarray:
        return np.array([t.cpu for t in self.tasks])

    @property
    def mem(self) -> np.ndarray:
        return np.array([t.mem for t in self.tasks])


@dataclass(frozen=True)
class TraceIssue:
    """A problem found in the trace. ``skipped`` says whether the job was dropped."""

    file: str
    line: int
    job: str
    kind: str  # bad-row | cycle | dangling-parent | duplicate-task | status | imputed
    detail: str
    skipped: bool = True

    @property
    def warn(self) -> bool:
        """Worth a warning: everything but an imputed value (a dropped row loses data)."""
        return self.kind != "imputed"

    def __str__(self) -> str:
        act = "job skipped" if self.skipped else "row dropped" if self.kind == "bad-row" else "kept"
        return f"{self.file}: line {self.line}: job {self.job or '?'}: {self.kind}: {self.detail} ({act})"


@dataclass
class TraceLoad:
    jobs: list[TraceJob]
    issues: list[TraceIssue] = field(default_factory=list)
    rows: int = 0

    @property
    def skipped_jobs(self) -> list[str]:
        return sorted({i.job for i in self.issues if i.skipped and i.job})

    @property
    def n_tasks(self) -> int:
        return sum(len(j.tasks) for j in self.jobs)

    @property
    def dropped_rows(self) -> int:
        """Bad rows that belong to no known job (so no job could be skipped for them)."""
        return sum(1 for i in self.issues if i.kind == "bad-row" and not i.skipped)

    @property
    def imputed_issues(self) -> list[TraceIssue]:
        """The ``imputed`` notes (one per empty value filled in) of the jobs kept, the ones
        a replay uses: a skipped job's are noted but do not count."""
        kept = {j.name for j in self.jobs}
        return [i for i in self.issues if i.kind == "imputed" and i.job in kept]

    @property
    def imputed(self) -> int:
        """Empty values filled in, in the jobs kept (cluster.md 1.3: impute, log the count)."""
        return len(self.imputed_issues)


def parse_task_name(name: str) -> tuple[int | None, tuple[int, ...]]:
    """``(task id, parent ids)``; the id is ``None`` for a non-DAG task (``task_*``, ``MergeTask*``)."""
    if name.startswith("task_") or name.startswith("MergeTask"):
        return None, ()
    tok = name.split("_")
    digits = "".join(ch for ch in tok[0] if ch in _DIGITS)
    if not digits:
        return None, ()
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses
    parents = tuple(int(t) for t in tok[1:] if t and t.isascii() and t.isdecimal())
    return int(digits), parents


class _BadRow(ValueError):
    pass


def _number(text: str, column: str, default: float | None, imputed: list[str]) -> float:
    text = text.strip()
    if text == "":
        if default is None:
            raise _BadRow(f"{column} is empty")
        imputed.append(f"{column} empty, used {default:g}")
        return default
    try:
        v = float(text)
    except ValueError:
        raise _BadRow(f"{column}={text!r} is not a number") from None
    if not math.isfinite(v):
        raise _BadRow(f"{column}={text!r} is not finite")
    return v


def _parse_row(row: list[str]) -> tuple[TraceTask | None, list[str]]:
    """Returns the task (line set by the caller) and notes about imputed values."""
    imputed: list[str] = []
    if len(row) != N_COLUMNS:
        raise _BadRow(f"expected {N_COLUMNS} columns, got {len(row)}")
    name = row[0].strip()
    if not name:
        raise _BadRow("task_name is empty")
    if not name.isascii() or not name.isprintable() or '"' in name or " " in name:
        # trace names are ASCII words; anything else is a damaged row (a stray quote, a
        # fragment of a broken record) whose dependencies cannot be trusted
        raise _BadRow(f"task_name {name[:40]!r} is not an ASCII trace name")
    instances = _number(row[1], "instance_num", IMPUTED_DEFAULTS["instance_num"], imputed)
    if instances < 1 or instances != int(instances):
        raise _BadRow(f"instance_num={row[1]!r} is not a positive integer")
    status = row[4].strip()
    start = _number(row[5], "start_time", None, imputed)
    end = _number(row[6], "end_time", None, imputed)
    if end < start:
        raise _BadRow(f"end_time {end:g} < start_time {start:g}")
    if not math.isfinite((end - start) * REF_HZ):
        raise _BadRow(f"duration {end - start:g} s is too large to simulate")
    plan_cpu = _number(row[7], "plan_cpu", IMPUTED_DEFAULTS["plan_cpu"], imputed)
    plan_mem = _number(row[8], "plan_mem", IMPUTED_DEFAULTS["plan_mem"], imputed)
    if plan_cpu <= 0:
        raise _BadRow(f"plan_cpu={row[7]!r} is not positive")
    if not 0 <= plan_mem <= 100:
        raise _BadRow(f"plan_mem={row[8]!r} outside the normalised range 0-100")
    try:
        tid, parents = parse_task_name(name)
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits() (4300)
        raise _BadRow(f"task_name {name[:40]!r}...: an id with too many digits to read") from None
    task = TraceTask(
        name=name,
        tid=-1 if tid is None else tid,
        parents=parents,
        instances=int(instances),
        status=status,
        start=start,
        end=end,
        cpu=plan_cpu / 100.0,
        mem=plan_mem,
        line=0,
    )
    return task, imputed


def _split_line(line: str) -> list[str]:
    """The fields of one physical line.

    No field of the schema holds a line break, so a record never spans lines: an unmatched
    quote spoils its own line only (``csv.reader`` would swallow the rows after it into one
    field, and count records rather than lines)."""
    text = line.rstrip("\r\n")
    if "\x00" in text:
        raise _BadRow("line contains a NUL byte")
    if "\ufffd" in text:
        raise _BadRow("line has bytes that are not UTF-8")
    if '"' in text:
        try:
            row = next(csv.reader((text,), strict=True), [])
        except csv.Error as err:
            raise _BadRow(f"malformed quoting ({err})") from None
    else:
        row = text.split(",")
    for f in row:
        if len(f) > FIELD_LIMIT:
            raise _BadRow(f"a field of {len(f)} characters (limit {FIELD_LIMIT})")
    return row


def _guess_job(line: str) -> str:
    """The job a line that cannot be parsed seems to belong to (third comma field), or ""."""
    parts = line.split(",", 3)
    job = parts[2].strip() if len(parts) > 2 else ""
    return job if 0 < len(job) <= 256 and '"' not in job and "\x00" not in job else ""


def _no_job_detail(why: str, row: list[str] | None) -> str:
    """The first part of a no-job-name issue; the nearest named rows are added later."""
    task = row[0].strip() if row else ""
    ok = 0 < len(task) <= 40 and task.isascii() and task.isprintable() and '"' not in task
    what = (
        f"task {task!r} cannot be given to a job (task names repeat across jobs)"
        if ok
        else "its job cannot be told"
    )
    return f"no job name ({why}); {what}, so no job is skipped for it"


def _nearest(before: tuple[int, str] | None, after: tuple[int, str] | None) -> str:
    def one(x, none):
        return f"line {x[0]} ({x[1]})" if x else none

    return f"nearest rows with a job: {one(before, 'none before')}, {one(after, 'none after')}"


def _find_cycle(n: int, preds: list[list[int]]) -> list[int]:
    """Indices of one cycle in the parent graph (empty when acyclic). Iterative DFS."""
    color = [0] * n  # 0 new, 1 on stack, 2 done
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, iter(preds[root]))]
        path = [root]
        color[root] = 1
        while stack:
            v, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[v] = 2
                stack.pop()
                path.pop()
            elif color[nxt] == 1:
                return path[path.index(nxt) :]
            elif color[nxt] == 0:
                color[nxt] = 1
                stack.append((nxt, iter(preds[nxt])))
                path.append(nxt)
    return []


def task_work_s(tasks: Sequence[TraceTask], preds: Sequence[Sequence[int]]) -> np.ndarray:
    """Each task's work in seconds: ``end - max(start, latest end of its parents)``, >= 0.

    ``start_time`` is the registration time, not the compute start (cluster.md 1.3; the
    maintainer in alibaba/clusterdata#56: a child has the same start_time as its parent), and
    a task starts only once every instance of every parent has completed (1.2). So the task
    cannot have computed before its last parent ended: ``end - start`` counted the parents'
    running time again in each child (the real job j_8, 26 s from first start to last end,
    replayed in 178 s). 0 when a parent's recorded end is after the task's own (the trace's
    times are not always consistent: instances can start before their task after a failover).
    The synthetic generator writes a child's start at its parents' last end, so its traces
    read the same as with ``end - start``.
    """
    ready = [max([t.start] + [tasks[p].end for p in ps]) for t, ps in zip(tasks, preds)]
    return np.array([max(t.end - r, 0.0) for t, r in zip(tasks, ready)], dtype=float)


def _is_header(row: list[str]) -> bool:
    """The published subset's header row (the column names), not a bad row of a job."""
    return tuple(f.strip().lower() for f in row) == COLUMNS


def _build_job(
    source: str, job: str, tasks: list[TraceTask]
) -> tuple[TraceJob | None, TraceIssue | None]:
    # a DAG task by its id, a non-DAG one (task_*, MergeTask*) by its name: a repeat of
    # either would run twice
    seen: dict[int | str, int] = {}
    for i, t in enumerate(tasks):
        key = t.name if t.tid < 0 else t.tid
        if key in seen:
            first = tasks[seen[key]]
            what = (
                f"task {t.name!r} already in the job"
                if t.tid < 0
                else f"task id {t.tid} in {t.name!r} already used by {first.name!r}"
            )
            return None, TraceIssue(
                source, t.line, job, "duplicate-task", f"{what} (line {first.line})"
            )
        seen[key] = i
    by_id = {k: i for k, i in seen.items() if isinstance(k, int)}
    fresh = max(by_id, default=0) + 1
    numbered = []
    for t in tasks:
        if t.tid < 0:
            t = TraceTask(
                t.name, fresh, (), t.instances, t.status, t.start, t.end, t.cpu, t.mem, t.line
            )
            fresh += 1
        numbered.append(t)
    preds: list[list[int]] = []
    for t in numbered:
        ps = []
        for p in t.parents:
            if p not in by_id:
                return None, TraceIssue(
                    source,
                    t.line,
                    job,
                    "dangling-parent",
                    f"{t.name!r} depends on task {p}, which the job does not have",
                )
            ps.append(by_id[p])
        preds.append(ps)
    cycle = _find_cycle(len(numbered), preds)
    if cycle:
        names = " -> ".join(numbered[i].name for i in reversed(cycle))
        line = min(numbered[i].line for i in cycle)
        return None, TraceIssue(source, line, job, "cycle", f"dependency cycle {names}")
    src = [p for i, ps in enumerate(preds) for p in ps]
    dst = [i for i, ps in enumerate(preds) for _ in ps]
    work = task_work_s(numbered, preds) * REF_HZ
    dag = make_dag(job, work, np.zeros(len(numbered)), src, dst, unit=f"cycles at {REF_HZ:g} Hz")
    return TraceJob(job, tuple(numbered), dag), None


def parse_batch_task(
    lines: Iterable[str],
    source: str = "<memory>",
    statuses: tuple[str, ...] | None = DEFAULT_STATUSES,
    max_jobs: int | None = None,
) -> TraceLoad:
    """Parse ``batch_task.csv`` text lines; jobs come out in order of first appearance.

    A first line of the column names (:data:`COLUMNS`) is a header: skipped, not a row.
    ``statuses``: rows with another status make their job skipped (an incomplete record);
    ``None`` accepts every status. ``max_jobs`` keeps only the first jobs seen.
    """
    rows = 0
    order: list[str] = []
    groups: dict[str, list[TraceTask]] = {}
    bad: dict[str, TraceIssue] = {}
    issues: list[TraceIssue] = []
    # rows without a job name, waiting for the next row with one: (line, detail, row before)
    nameless: list[tuple[int, str, tuple[int, str] | None]] = []
    named: tuple[int, str] | None = None  # the last row with a job name: (line, job)

    def flush(after: tuple[int, str] | None) -> None:
        for ln, detail, before in nameless:
            text = f"{detail}; {_nearest(before, after)}"
            issues.append(TraceIssue(source, ln, "", "bad-row", text, skipped=False))
        nameless.clear()

    for lineno, line in enumerate(lines, start=1):
        try:
            row = _split_line(line)
        except _BadRow as err:
            rows += 1
            job = _guess_job(line)
            if job and job not in groups and (max_jobs is None or len(order) < max_jobs):
                order.append(job)
                groups[job] = []
            if job in groups:
                bad.setdefault(job, TraceIssue(source, lineno, job, "bad-row", str(err)))
            elif not job:
                why = f"{err}, so its job_name cannot be read"
                nameless.append((lineno, _no_job_detail(why, None), named))
            continue
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if lineno == 1 and _is_header(row):
            continue
        rows += 1
        job = row[2].strip() if len(row) > 2 else ""
        if not job:
            why = (
                "the job_name column is empty"
                if len(row) > 2
                else f"{len(row)} of {N_COLUMNS} columns: the line ends before job_name"
            )
            nameless.append((lineno, _no_job_detail(why, row), named))
            continue
        named = (lineno, job)
        if nameless:
            flush(named)
        if job not in groups:
            if max_jobs is not None and len(order) >= max_jobs:
                continue
            order.append(job)
            groups[job] = []
        try:
            task, imputed = _parse_row(row)
        except _BadRow as err:
            bad.setdefault(job, TraceIssue(source, lineno, job, "bad-row", str(err)))
            continue
        if statuses is not None and task.status not in statuses:
            bad.setdefault(
                job,
                TraceIssue(
                    source,
                    lineno,
                    job,
                    "status",
                    f"{task.name!r} has status {task.status!r}, accepted: {', '.join(statuses)}",
                ),
            )
            continue
        for note in imputed:
            issues.append(
                TraceIssue(source, lineno, job, "imputed", f"{task.name!r}: {note}", skipped=False)
            )
        groups[job].append(
            TraceTask(
                task.name,
                task.tid,
                task.parents,
                task.instances,
                task.status,
                task.start,
                task.end,
                task.cpu,
                task.mem,
                lineno,
            )
        )
    flush(None)
    jobs: list[TraceJob] = []
    for job in order:
        if job in bad:
            issues.append(bad[job])
            continue
        built, issue = _build_job(source, job, groups[job])
        if issue is not None:
            issues.append(issue)
        else:
            jobs.append(built)
    issues.sort(key=lambda i: i.line)
    return TraceLoad(jobs, issues, rows)


def _open_lines(path: str) -> Iterator[str]:
    """The file's lines; ``utf-8-sig`` drops a leading byte-order mark (an editor's or
    Excel's export), which would otherwise spoil the first task name and skip its job.

    A gzip file is known by its first bytes, not its name (one not named ``.gz`` read as a
    file of NUL bytes, "no usable job"); a tar archive (the published ``batch_task.tar.gz``)
    is refused with what to do, not read with its header glued to the first row."""
    import gzip
    import zlib

    try:
        # one open (a --trace <(zcat ...) pipe cannot be opened twice), its first bytes sniffed
        with open(path, "rb") as fh:
            stream, packed = sniff_gzip(fh)
            if not packed and path.endswith(".gz"):
                raise ValueError(f"{path}: not a readable .gz file (not gzip-compressed)")
            raw = gzip.GzipFile(fileobj=stream, mode="rb") if packed else stream
            if raw.peek(512)[257:262] == b"ustar":
                raise ValueError(
                    f"{path}: is a tar archive; extract the CSV from it first (tar -xzf "
                    f"{path}) and give that file"
                )
            # a bad byte becomes U+FFFD and spoils its row only (_split_line), not the file
            with io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="") as f:
                yield from f
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        # gzip's own message names no file ("Not a gzipped file (b'no')")
        raise ValueError(f"{path}: not a readable .gz file ({err})") from None


def read_batch_task(
    path: str | os.PathLike[str],
    statuses: tuple[str, ...] | None = DEFAULT_STATUSES,
    max_jobs: int | None = None,
) -> TraceLoad:
    """Read a ``batch_task.csv`` (or ``.csv.gz``) file; see :func:`parse_batch_task`."""
    path = os.fspath(path)
    return parse_batch_task(_open_lines(path), source=path, statuses=statuses, max_jobs=max_jobs)
