"""``hidvfs bots list|run|profile|report|study``: BOTS campaigns on the simulated or the real board."""

from __future__ import annotations

import click

from tools.cmd_profile import measure_options
from tools.common import (
    FiniteFloatRange,
    Friendly,
    emit_json,
    ensure_parent,
    fail,
    not_empty,
    trusted_sysfs_root,
)


@click.group("bots", cls=Friendly)
def bots() -> None:
    """Run Barcelona OpenMP Tasks Suite campaigns under several policies and seeds.

    `--backend sim` runs the kernels' DAG models on the simulated board (no hardware needed);
    `--backend native` runs the BOTS binaries you built (see README) on this machine.
    """


def _check_class(backend: str, bench: str, cls: str) -> None:
    """Refuse (exit 2) a --class that a selected kernel lacks on ``backend``, naming the
    backend whose classes it lists: the simulator's DAG models and the BOTS binaries have
    different classes (`bots list` shows both). Unknown kernels are left to the spec check
    (a --spec file's classes too: bots_bench/spec.py says the same without the backend)."""
    from bots_bench.dags import CLASSES as SIM_CLASSES
    from bots_bench.registry import KERNEL_NAMES, KERNELS

    names = KERNEL_NAMES if bench == "all" else [b.strip() for b in bench.split(",") if b.strip()]
    if not names or any(n not in KERNELS for n in names):
        return
    sim = backend == "sim"
    classes_of = {n: tuple(SIM_CLASSES.get(n, ()) if sim else KERNELS[n].classes) for n in names}
    lacking = [n for n in names if cls not in classes_of[n]]
    if not lacking:
        return
    k = lacking[0]
    kind, other_kind = ("sim", "native") if sim else ("native", "sim")
    other = KERNELS[k].classes if sim else SIM_CLASSES.get(k, ())
    hint = f"; {cls} is a {other_kind}-only class of {k}" if cls in other else ""
    # the spec check's wording (`<command line>: key 'classes'`), with the backend named
    fail(
        f"<command line>: key 'classes': expected a class every selected kernel has under "
        f"--backend {backend} ({k}'s {kind} classes: {', '.join(classes_of[k])}{hint}; "
        f"`hidvfs bots list` shows both backends' classes), got {cls!r}"
    )


def _check_selection(backend, bench, cls, policy="performance", board=None, bots_bin=None):
    """Refuse (exit 2) a bad --bench, --class or --policy before anything runs, with the
    checks and messages of `bots run` (its spec): a typo would otherwise end as a failed
    run per kernel, and an empty --bench as every kernel. Returns the checked spec."""
    from tools.native_campaign import build_spec

    _check_class(backend, bench, cls)
    return build_spec(
        backend=backend,
        board=board or "tx2",
        bench=bench,
        cls=cls,
        policy=policy,
        seeds=1,
        bots_bin=bots_bin or ".",
        spec_file=None,
    )


#: the ``bots run`` parameters a --spec file sets instead
SPEC_SETS = (
    "backend",
    "board",
    "bench",
    "cls",
    "policy",
    "seeds",
    "bots_bin",
    "timeout_s",
    "cooldown_start_temp",
    "cooldown_max_wait",
)
#: what a native run does by default (bots_bench.spec: Cooldown, RunConfig.timeout_s)
NATIVE_ONLY = ("timeout_s", "cooldown_start_temp", "cooldown_max_wait")


def _given_on_command_line(ctx: click.Context, names) -> list[str]:
    """The options among the parameters ``names`` given on the command line, as spelled
    there (``--class``, ``--timeout``)."""
    opts = {p.name: p.opts[0] for p in ctx.command.params}
    return [
        opts[n]
        for n in names
        if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE
    ]


@bots.command("run")
@click.option(
    "--backend",
    type=click.Choice(["sim", "native"]),
    default="sim",
    show_default=True,
    help="Simulated board or the real one.",
)
@click.option(
    "--board",
    default=None,
    help="Board spec (sim; default tx2). Native runs use the detected board; a --board that "
    "differs from it is refused, and where no board is detected it is used as given (with a "
    "warning).",
    callback=not_empty,
    metavar="BOARD",
)
@click.option(
    "--bench",
    default="all",
    show_default=True,
    help="Kernels: all, or a comma list (fib,sort,...).",
    metavar="KERNELS",
)
@click.option(
    "--class",
    "cls",
    default="small",
    show_default=True,
    help="Input class (test, small, medium, ...): the sim classes with --backend sim, the "
    "native ones with --backend native (`hidvfs bots list` shows both).",
    metavar="CLASS",
)
@click.option(
    "--policy",
    default="performance,schedutil,powersave",
    show_default=True,
    help="Comma list of policies; ratios are to the first.",
    metavar="POLICIES",
)
@click.option(
    "--seeds",
    default=1,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Seeds 0..N-1 per kernel and policy.",
)
@click.option(
    "--deadline-slack",
    default=None,
    type=FiniteFloatRange(min=1.0),
    help="Give each job a deadline of SLACK x its reference makespan (native: the profile "
    "stored as BENCH.CLASS, or BENCH.CLASS.VARIANT for a spec's variant other than the "
    "default, with @LABEL for a spec's label other than gcc: `hidvfs bots profile --variant "
    "--label`; see --profiles).",
)
@click.option(
    "--profiles",
    "profiles_path",
    default="/var/lib/hidvfs/profiles.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Reference profiles for native runs (hidvfs profile measure --name BENCH.CLASS).",
)
@click.option(
    "--db",
    default=None,
    type=click.Path(dir_okay=False),
    help="SQLite results store; runs already done in it are skipped, failed ones run again. "
    "Campaigns run at once on one --db share its runs: each is run by one of them. "
    "Default: a simulated campaign from flags keeps its runs in memory only (pass --db to "
    "keep them for `hidvfs bots report`); --backend native and any --spec campaign write "
    "results.sqlite in the current folder.",
)
@click.option(
    "--no-retry-failed",
    "no_retry_failed",
    is_flag=True,
    help="Keep the failed runs stored in --db instead of running them again.",
)
@click.option(
    "--bots-bin",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder with BOTS binaries (native).",
)
@click.option(
    "--spec",
    "spec_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Campaign spec YAML instead of --backend, --board, --bench, --class, --policy, "
    "--seeds and --bots-bin (its keys are not the flags' names: see below and README).",
)
@click.option(
    "--sysfs-root",
    default="/",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    callback=trusted_sysfs_root,
    help="Tree the native backend drives (/ on a board; a fake tree to try it).",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=600.0,
    show_default=True,
    type=FiniteFloatRange(min=0.1),
    help="Native: seconds before a run is killed (a failed run; a kernel's untimed -c "
    "verification run gets 4 x this).",
)
@click.option(
    "--cooldown-start-temp",
    default=45.0,
    show_default=True,
    type=FiniteFloatRange(min=0.0),
    help="Native: before each run, wait until the hottest CPU zone is at or below this (°C).",
    metavar="CELSIUS",
)
@click.option(
    "--cooldown-max-wait",
    default=120.0,
    show_default=True,
    type=FiniteFloatRange(min=0.0),
    help="Native: wait at most this long for it (s); the run then starts hot, said on stderr "
    "and stored as its start_temp_c. 0: no cool-down.",
    metavar="SECONDS",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run records as a JSON list.")
def run_cmd(
    backend,
    board,
    bench,
    cls,
    policy,
    seeds,
    deadline_slack,
    profiles_path,
    db,
    no_retry_failed,
    bots_bin,
    spec_file,
    sysfs_root,
    timeout_s,
    cooldown_start_temp,
    cooldown_max_wait,
    as_json,
) -> None:
    """Run a campaign and print run records (--json) or a table with ratios to the first policy.

    A re-run with the same --db resumes: successful runs are kept, failed ones (a missing
    profile, a timeout ...) are run again unless --no-retry-failed. Exits 1 when any run of
    the campaign failed.

    A campaign can also be a YAML file, `--spec campaign.yaml`; its keys (the flag each
    replaces in the comments) are:

    \b
      kernels: [fib, sort]          # --bench; or: all
      classes: [small]              # --class; every kernel must have each
      policies: [schedutil, hidvfs] # --policy; ratios are to the first
      seeds: 3                      # --seeds; or a list: [42, 123, 456]
      board: tx2                    # --board
      backend: native               # --backend: sim or native
      bots_bin: bots/bin            # --bots-bin (native); relative to the file
      repetitions: 1                # optional
      cooldown: {start_temp_c: 45, max_wait_s: 120}   # optional; null: no cool-down
      timeout_s: 600                # optional; also: threads (native), variant
                                    # (or serial), label, check, deadline_s, name

    With --spec, --deadline-slack, --profiles, --db, --no-retry-failed, --sysfs-root and
    --json still apply; the flags the file replaces are ignored, with a note."""
    from tools.native_campaign import run_campaign_cli

    if not spec_file:
        _check_class(backend, bench, cls)
    if spec_file:
        ctx = click.get_current_context()
        given = _given_on_command_line(ctx, SPEC_SETS)
        if given:
            click.echo(
                f"note: --spec {spec_file} sets the campaign: {', '.join(given)} ignored",
                err=True,
            )

    native = {}
    if backend == "native" and not spec_file:
        native = {
            "timeout_s": timeout_s,
            "cooldown": None
            if cooldown_max_wait == 0
            else {"start_temp_c": cooldown_start_temp, "max_wait_s": cooldown_max_wait},
        }
    elif backend == "sim" and not spec_file:
        ctx = click.get_current_context()
        given = _given_on_command_line(ctx, NATIVE_ONLY)
        if given:
            click.echo(
                f"note: {', '.join(given)} ignored with the sim backend (the simulator has "
                "no run timeout nor cool-down)",
                err=True,
            )
    run_campaign_cli(
        backend=backend,
        board=board,
        bench=bench,
        cls=cls,
        policy=policy,
        seeds=seeds,
        db=db,
        bots_bin=bots_bin,
        spec_file=spec_file,
        as_json=as_json,
        deadline_slack=deadline_slack,
        sysfs_root=sysfs_root,
        profiles_path=profiles_path,
        retry_failed=not no_retry_failed,
        **native,
    )


@bots.command("list")
@click.option(
    "--bots-bin",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder with BOTS binaries to look for.",
)
@click.option(
    "--kernel",
    "kernel_name",
    default=None,
    help="Show one kernel's classes: the simulator's model parameters beside the native "
    "binary's arguments (one class name is not always one input on both backends).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(bots_bin: str | None, kernel_name: str | None, as_json: bool) -> None:
    """The 12 kernels: the binary `bots run` runs by default (KERNEL.gcc.VARIANT, other
    builds with a spec's variant and label), the input classes, and with --bots-bin the
    builds found there (by variant; a second compiler's build of one is VARIANT@LABEL; one
    that is there but not executable is marked so)."""
    from bots_bench.dags import CLASSES
    from bots_bench.registry import KERNELS, binary_name, find_binaries, find_unexecutable

    if kernel_name is not None:
        _list_classes(kernel_name, as_json)
        return
    if bots_bin:
        from tools.native_campaign import check_bots_bin

        check_bots_bin(bots_bin)
    found = find_binaries(bots_bin) if bots_bin else {}
    # `bots run` refuses these with "not executable (chmod +x ...)": not "none" here
    unexecutable = find_unexecutable(bots_bin) if bots_bin else {}
    rows = []
    for name, k in KERNELS.items():
        rows.append(
            {
                "kernel": name,
                "binary": binary_name(name),
                "programs": list(k.programs),
                "classes": sorted(k.classes),
                "sim_classes": list(CLASSES.get(name, ())),
                "check_runs_sequential": k.check_runs_sequential,
                "binaries_found": {v: str(p) for v, p in found.get(name, {}).items()},
                "binaries_not_executable": {
                    v: str(p) for v, p in unexecutable.get(name, {}).items()
                },
            }
        )
    if as_json:
        emit_json(rows)
        return
    table = [["kernel", "binary (default)", "sim classes", "native classes"]]
    if bots_bin:
        table[0].append(f"found in {bots_bin}")
    for name, r in zip(KERNELS, rows):
        # smallest first, as declared
        cells = [
            r["kernel"],
            r["binary"],
            ",".join(r["sim_classes"]),
            ",".join(KERNELS[name].classes),
        ]
        if bots_bin:
            cells.append(_found_cell(r["binaries_found"], r["binaries_not_executable"]))
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    click.echo(
        "sim classes: what `bots run --backend sim` (the default) runs; native classes: the "
        "BOTS binaries' inputs (`--backend native`)"
    )
    if not bots_bin:
        click.echo(
            "(pass --bots-bin DIR to look for built binaries; --kernel NAME shows a kernel's "
            "classes, model parameters beside native arguments)"
        )


def _found_cell(found: dict, unexecutable: dict) -> str:
    """The builds found (``omp-tasks,serial``), then those there but not executable, which
    `bots run` would refuse: ``serial; omp-tasks (not executable: chmod +x)``."""
    cells = [",".join(sorted(found))] if found else []
    if unexecutable:
        cells.append(f"{','.join(sorted(unexecutable))} (not executable: chmod +x)")
    return "; ".join(cells) or "none"


def class_rows(kernel_name: str) -> list[dict]:
    """Per class of ``kernel_name``: the simulator model's parameters and the native
    binary's arguments (None where a backend lacks the class). A name on both is not
    always one input: fib's sim ``small`` is n = 40 where the native ``small`` is ``-n 10``."""
    from bots_bench.dags import class_params
    from bots_bench.registry import kernel

    k = kernel(kernel_name)  # ValueError naming the known kernels
    sim = class_params(kernel_name)
    rows = []
    for cls in dict.fromkeys([*k.classes, *sim]):
        ic = k.classes.get(cls)
        native = None
        if ic is not None:
            native = list(ic.args) + ([f"input {ic.input_file}"] if ic.input_file else [])
            native += [f"-x {ic.cutoff}"] if ic.cutoff is not None else []
        params = sim.get(cls)
        rows.append(
            {"class": cls, "sim": None if params is None else dict(params), "native": native}
        )
    return rows


def _list_classes(kernel_name: str, as_json: bool) -> None:
    try:
        rows = class_rows(kernel_name)
    except ValueError as err:
        fail(str(err))
    if as_json:
        emit_json(rows)
        return
    table = [["class", "sim model", "native arguments"]]
    for r in rows:
        sim = "-" if r["sim"] is None else " ".join(f"{k}={v}" for k, v in r["sim"].items())
        native = "-" if r["native"] is None else " ".join(r["native"]) or "(none)"
        table.append([r["class"], sim, native])
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    click.echo(
        f"{kernel_name}: one class name is not always one input on both backends; compare "
        "the columns (-: that backend has no such class)"
    )


@bots.command("profile")
@click.option(
    "--bots-bin",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder with the BOTS binaries you built.",
)
@click.option(
    "--bench",
    default="all",
    show_default=True,
    help="Kernels: all, or a comma list.",
    metavar="KERNELS",
)
@click.option(
    "--class", "cls", default="small", show_default=True, help="Input class.", metavar="CLASS"
)
@click.option(
    "--variant",
    default="omp-tasks",
    show_default=True,
    help="BOTS build to time (omp-tasks-manual, omp-tasks-if_clause, omp-tasks-tied, "
    "for-omp-tasks, serial, ...: `hidvfs bots list` shows the builds). Each build is another "
    "binary with its own profile, stored as BENCH.CLASS.VARIANT (BENCH.CLASS for the "
    "default); a native campaign with --deadline-slack uses the profile of its spec's variant.",
    metavar="VARIANT",
)
@click.option(
    "--label",
    default="gcc",
    show_default=True,
    help="Compiler label of the build to time (the binaries' BENCH.LABEL.VARIANT names, as "
    "./configure --compiler named them: clang, icc, ...). Another compiler's build has its "
    "own profile, stored with @LABEL appended (BENCH.CLASS@clang, "
    "BENCH.CLASS.VARIANT@clang); a native campaign with --deadline-slack uses the profile of "
    "its spec's label.",
    metavar="LABEL",
)
@measure_options
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def profile_cmd(
    bots_bin,
    bench,
    cls,
    variant,
    label,
    store,
    sysfs_root,
    board,
    state_dir,
    socket_path,
    timeout_s,
    replace,
    as_json,
) -> None:
    """Measure the reference profile of each kernel's binary (stored as BENCH.CLASS, or
    BENCH.CLASS.VARIANT for a --variant other than the default, with @LABEL for a --label
    other than gcc), so that native campaigns with --deadline-slack and
    `hidvfs run --name BENCH.CLASS` can plan deadlines. A run whose verification fails stores
    nothing for that kernel."""
    from dataclasses import asdict

    from bots_bench import registry
    from bots_bench.native import VERIFY_TIMEOUT_FACTOR
    from bots_bench.parser import BotsParseError, parse_output, run_error
    from bots_bench.reference import reference_cluster
    from tools.cmd_profile import MeasureSession
    from tools.native_campaign import check_bots_bin
    from tools.profile_measure import command_timer

    check_bots_bin(bots_bin)  # before the session opens the board or a kernel is timed
    kernels = _check_selection("native", bench, cls, bots_bin=bots_bin).kernels
    try:  # a bad label or variant is refused before the board is opened
        registry.check_label(label)
    except registry.RegistryError as err:
        fail(f"--label {label}: {err}")
    try:
        names = {k: registry.job_name(k, cls, variant, label) for k in kernels}
    except registry.RegistryError as err:
        fail(f"--variant {variant}: {err}")
    session = MeasureSession(sysfs_root, board, state_dir, socket_path, store)
    threads = len(reference_cluster(session.spec).cpus)
    rows, failed = [], 0
    for k in kernels:
        name = names[k]
        try:
            cmd = registry.command_for(k, cls, bots_bin, threads, variant=variant, label=label)

            def verified(text: str, check: bool = cmd.check, kernel: str = k) -> str | None:
                try:
                    return run_error(parse_output(text), kernel, check)
                except BotsParseError as err:
                    return str(err)

            verify = None
            # its -c also runs the sequential version: one untimed run (not for a build that
            # cannot check, such as most serial ones: their -c prints Verification = n/a)
            if not cmd.check and registry.needs_separate_check(k, variant):
                check_cmd = registry.command_for(
                    k, cls, bots_bin, threads, variant=variant, label=label, check=True
                )
                check_timer = command_timer(
                    check_cmd.env, lambda text, kernel=k: verified(text, True, kernel)
                )

                def verify(cpus, argv=tuple(check_cmd.argv), run=check_timer):
                    run(list(argv), cpus, timeout_s * VERIFY_TIMEOUT_FACTOR)

            # the kernels that need `ulimit -s unlimited` get it while they are timed too
            prof, times = session.measure(
                list(cmd.argv),
                name,
                timeout_s,
                1,
                replace,
                command_timer(cmd.env, verified),
                stack="unlimited" if registry.input_class(k, cls).unlimited_stack else None,
                verify=verify,
            )
        except Exception as err:  # noqa: BLE001 - one kernel failing is reported, the rest go on
            failed += 1
            rows.append({"name": name, "ok": False, "error": str(err)})
            if not as_json:
                click.echo(f"{name}: failed: {err}", err=True)
            continue
        rows.append({"ok": True, "board": session.spec.name, **asdict(prof), "times_s": times})
        if not as_json:
            click.echo(
                f"{name}: reference makespan {prof.ref_makespan_s:.3f} s, C {prof.work_s:.3f} s, "
                f"L {prof.span_s:.3f} s, beta {prof.beta:.2f} (version {prof.version})"
            )
    if as_json:
        emit_json(rows)
    if failed:
        raise SystemExit(1)


@bots.command("report")
@click.option(
    "--db",
    default="results.sqlite",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Results store (written by `hidvfs bots run`: see its --db).",
)
@click.option(
    "--out",
    "out_dir",
    default="report",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Output folder.",
)
@click.option(
    "--baseline",
    default=None,
    help="Policy the ratios are taken against (default: the first of schedutil, ondemand, "
    "performance, maxfreq with runs, else the first policy stored).",
    metavar="POLICY",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the report's numbers (summary.json: per table, per policy) on stdout.",
)
def report_cmd(db: str, out_dir: str, baseline: str | None, as_json: bool) -> None:
    """Write report.md, report.html and PNG plots from a results store."""
    import json
    import os

    from bots_bench.report import write_report

    if not os.path.lexists(db):  # what to do, not click's "File ... does not exist"
        ctx = click.get_current_context()
        if ctx.get_parameter_source("db") is click.core.ParameterSource.DEFAULT:
            fail(
                f"no results store {db} here: run a campaign first (`hidvfs bots run --spec "
                f"FILE` and --backend native write {db} in the current folder; a simulated "
                f"campaign from flags keeps its runs in memory unless given --db {db}), or "
                "name the store with --db"
            )
        fail(f"--db {db}: no such results store; run a campaign with --db {db} first")

    # its parent made now; the report folder itself once the store holds something to report
    ensure_parent("--out", out_dir, folder=True)
    files = write_report(db, out_dir, baseline=baseline)
    if as_json:
        emit_json(json.loads(files.summary.read_text()))
    else:
        click.echo(f"wrote {files.markdown}, {files.html} and {len(files.plots)} plots")
    if not files.plotting:
        click.echo(
            'note: no plots: they need the report extra (matplotlib): pip install "hidvfs[report]"',
            err=True,
        )


@bots.command("study")
@click.argument(
    "name", type=click.Choice(["deadline-vs-maxfreq", "mixed-criticality", "vs-geardvfs"])
)
@click.option(
    "--board",
    default=None,
    help="Board (simulated; default tx2). Native: the detected board; a different one is refused.",
    callback=not_empty,
    metavar="BOARD",
)
@click.option(
    "--backend",
    type=click.Choice(["sim", "native"]),
    default="sim",
    show_default=True,
    help="Simulated board or the real one.",
)
@click.option(
    "--seeds",
    default=3,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Seeds per comparison.",
)
@click.option(
    "--bench",
    default="all",
    show_default=True,
    help="Kernels for the campaign studies.",
    metavar="KERNELS",
)
@click.option(
    "--class", "cls", default="small", show_default=True, help="Input class.", metavar="CLASS"
)
@click.option(
    "--slack",
    default=1.5,
    show_default=True,
    type=FiniteFloatRange(min=1.0),
    help="Deadline = SLACK x reference makespan.",
)
@click.option(
    "--policy",
    default="hidvfs",
    show_default=True,
    help="Deadline-aware policy for deadline-vs-maxfreq.",
    metavar="POLICY",
)
@click.option(
    "--bots-bin", default=None, type=click.Path(file_okay=False), help="BOTS binaries (native)."
)
@click.option(
    "--sysfs-root",
    default="/",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    callback=trusted_sysfs_root,
    help="Tree for native runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def study_cmd(
    name, board, backend, seeds, bench, cls, slack, policy, bots_bin, sysfs_root, as_json
) -> None:
    """Run a canned study and print a short table (exit 1 if its assertion fails)."""
    from bots_bench import studies
    from tools.native_campaign import check_bots_bin, note_sim_ignores_bots_bin

    runner = None
    nb = None
    if backend == "sim" and bots_bin:
        note_sim_ignores_bots_bin()
    if backend == "native":
        if name == "mixed-criticality":
            fail("mixed-criticality runs in the simulator (it needs a controlled periodic HI job)")
        check_bots_bin(bots_bin)  # before the board is opened or a reference run is made
    kernels = None  # mixed-criticality runs its own jobs: --bench, --class, --policy unused
    if name != "mixed-criticality":
        pols = policy if name == "deadline-vs-maxfreq" else "performance"
        spec = _check_selection(
            backend, bench, cls, pols, board if backend == "sim" else None, bots_bin
        )
        if len(spec.policies) != 1:
            fail(f"--policy {policy}: {name} compares one policy with maxfreq")
        kernels, policy = list(spec.kernels), spec.policies[0]
    if backend == "native":
        from tools.native_study import native_runner

        runner, nb = native_runner(
            board, cls, bots_bin, sysfs_root, slack if name == "deadline-vs-maxfreq" else None
        )
        board = nb.platform.spec.name
    board = board or "tx2"
    try:
        if nb is not None:  # the study's policies on a board hidvfs has agents for
            from tools.native_campaign import refuse_learned_without_agents

            ran = [policy, "maxfreq"] if name == "deadline-vs-maxfreq" else ["hidvfs", "geardvfs"]
            refuse_learned_without_agents(ran, board)
        if name == "deadline-vs-maxfreq":
            res = studies.deadline_vs_maxfreq(
                board,
                policy=policy,
                seeds=seeds,
                slack=slack,
                kernels=kernels,
                cls=cls,
                runner=runner,
            )
        elif name == "vs-geardvfs":
            res = studies.vs_geardvfs(board, seeds=seeds, kernels=kernels, cls=cls, runner=runner)
        else:
            res = studies.mixed_criticality(board, seeds=seeds)
    except KeyboardInterrupt as err:  # the line the CLI ends with says what was kept
        err.hint = (
            "nothing was kept: a study keeps its runs in memory (the same command again starts "
            "it over)"
        )
        raise
    finally:
        if nb is not None:
            nb.close()
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(studies.format_study(res))
    if not res.ok:
        raise SystemExit(1)
