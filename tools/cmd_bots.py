"""``hidvfs bots list|run|profile|report|study``: BOTS campaigns on the simulated or the real board."""

from __future__ import annotations

import os

import click

from tools.cmd_profile import measure_options
from tools.common import Friendly, emit_json, fail


@click.group("bots", cls=Friendly)
def bots() -> None:
    """Run Barcelona OpenMP Tasks Suite campaigns under several policies and seeds.

    `--backend sim` runs the kernels' DAG models on the simulated board (no hardware needed);
    `--backend native` runs the BOTS binaries you built (see README) on this machine.
    """


def _kernels(bench: str) -> list[str]:
    from bots_bench.dags import KERNELS

    if bench.strip().lower() == "all":
        return list(KERNELS)
    names = [b.strip().lower() for b in bench.split(",") if b.strip()]
    for n in names:
        if n not in KERNELS:
            raise ValueError(f"unknown kernel {n!r}; known: {', '.join(KERNELS)}")
    return names


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
    "differs from it is refused.",
)
@click.option(
    "--bench",
    default="all",
    show_default=True,
    help="Kernels: all, or a comma list (fib,sort,...).",
)
@click.option(
    "--class",
    "cls",
    default="small",
    show_default=True,
    help="Input class (test, small, medium, ...).",
)
@click.option(
    "--policy",
    default="performance,schedutil,powersave",
    show_default=True,
    help="Comma list of policies; ratios are to the first.",
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
    type=click.FloatRange(min=1.0),
    help="Give each job a deadline of SLACK x its reference makespan (native: the profile "
    "stored as BENCH.CLASS, see --profiles).",
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
    help="SQLite results store; runs already done in it are skipped, failed ones run again.",
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
    help="Campaign spec YAML instead of flags.",
)
@click.option(
    "--sysfs-root",
    default="/",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="Tree the native backend drives (/ on a board; a fake tree to try it).",
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
    as_json,
) -> None:
    """Run a campaign and print run records (--json) or a table with ratios to the first policy.

    A re-run with the same --db resumes: successful runs are kept, failed ones (a missing
    profile, a timeout ...) are run again unless --no-retry-failed. Exits 1 when any run of
    the campaign failed."""
    from tools.native_campaign import run_campaign_cli

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
    )


@bots.command("list")
@click.option(
    "--bots-bin",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder with BOTS binaries to look for.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(bots_bin: str | None, as_json: bool) -> None:
    """The 12 kernels: binary names, input classes, and which binaries were found."""
    from bots_bench.dags import CLASSES
    from bots_bench.registry import KERNELS, find_binaries

    if bots_bin and not os.path.isdir(bots_bin):
        fail(f"--bots-bin {bots_bin}: no such folder (build BOTS there, see README)")
    found = find_binaries(bots_bin) if bots_bin else {}
    rows = []
    for name, k in KERNELS.items():
        rows.append(
            {
                "kernel": name,
                "programs": list(k.programs),
                "classes": sorted(k.classes),
                "sim_classes": list(CLASSES.get(name, ())),
                "check_runs_sequential": k.check_runs_sequential,
                "binaries_found": {v: str(p) for v, p in found.get(name, {}).items()},
            }
        )
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        have = ", ".join(sorted(r["binaries_found"])) if bots_bin else "-"
        click.echo(
            f"{r['kernel']:<10} classes {','.join(r['classes']):<32} found: {have or 'none'}"
        )
    if not bots_bin:
        click.echo("(pass --bots-bin DIR to look for built binaries)")


@bots.command("profile")
@click.option(
    "--bots-bin",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="Folder with the BOTS binaries you built.",
)
@click.option("--bench", default="all", show_default=True, help="Kernels: all, or a comma list.")
@click.option("--class", "cls", default="small", show_default=True, help="Input class.")
@measure_options
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
def profile_cmd(
    bots_bin,
    bench,
    cls,
    store,
    sysfs_root,
    board,
    state_dir,
    socket_path,
    timeout_s,
    replace,
    as_json,
) -> None:
    """Measure the reference profile of each kernel's binary (stored as BENCH.CLASS), so that
    native campaigns with --deadline-slack and `hidvfs run --name BENCH.CLASS` can plan
    deadlines. A run whose verification fails stores nothing for that kernel."""
    from dataclasses import asdict

    from bots_bench import registry
    from bots_bench.parser import BotsParseError, parse_output, run_error
    from bots_bench.reference import reference_cluster
    from tools.cmd_profile import MeasureSession
    from tools.profile_measure import command_timer

    try:
        kernels = _kernels(bench)
    except ValueError as err:
        fail(str(err))
    session = MeasureSession(sysfs_root, board, state_dir, socket_path, store)
    threads = len(reference_cluster(session.spec).cpus)
    rows, failed = [], 0
    for k in kernels:
        name = registry.job_name(k, cls)
        try:
            cmd = registry.command_for(k, cls, bots_bin, threads)

            def verified(text: str, check: bool = cmd.check, kernel: str = k) -> str | None:
                try:
                    return run_error(parse_output(text), kernel, check)
                except BotsParseError as err:
                    return str(err)

            # the kernels that need `ulimit -s unlimited` get it while they are timed too
            prof, times = session.measure(
                list(cmd.argv),
                name,
                timeout_s,
                1,
                replace,
                command_timer(cmd.env, verified),
                stack="unlimited" if registry.input_class(k, cls).unlimited_stack else None,
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
    type=click.Path(exists=True, dir_okay=False),
    help="Results store.",
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
)
def report_cmd(db: str, out_dir: str, baseline: str | None) -> None:
    """Write report.md, report.html and PNG plots from a results store."""
    from bots_bench.report import write_report

    files = write_report(db, out_dir, baseline=baseline)
    click.echo(f"wrote {files.markdown}, {files.html} and {len(files.plots)} plots")


@bots.command("study")
@click.argument(
    "name", type=click.Choice(["deadline-vs-maxfreq", "mixed-criticality", "vs-geardvfs"])
)
@click.option(
    "--board",
    default=None,
    help="Board (simulated; default tx2). Native: the detected board; a different one is refused.",
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
@click.option("--bench", default="all", show_default=True, help="Kernels for the campaign studies.")
@click.option("--class", "cls", default="small", show_default=True, help="Input class.")
@click.option(
    "--slack",
    default=1.5,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Deadline = SLACK x reference makespan.",
)
@click.option(
    "--policy",
    default="hidvfs",
    show_default=True,
    help="Deadline-aware policy for deadline-vs-maxfreq.",
)
@click.option(
    "--bots-bin", default=None, type=click.Path(file_okay=False), help="BOTS binaries (native)."
)
@click.option(
    "--sysfs-root",
    default="/",
    show_default=True,
    type=click.Path(exists=True, file_okay=False),
    help="Tree for native runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def study_cmd(
    name, board, backend, seeds, bench, cls, slack, policy, bots_bin, sysfs_root, as_json
) -> None:
    """Run a canned study and print a short table (exit 1 if its assertion fails)."""
    from bots_bench import studies

    kernels = _kernels(bench)
    runner = None
    nb = None
    if backend == "native":
        if name == "mixed-criticality":
            fail("mixed-criticality runs in the simulator (it needs a controlled periodic HI job)")
        from tools.native_study import native_runner

        runner, nb = native_runner(
            board, cls, bots_bin, sysfs_root, slack if name == "deadline-vs-maxfreq" else None
        )
        board = nb.platform.spec.name
    board = board or "tx2"
    try:
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
    finally:
        if nb is not None:
            nb.close()
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(studies.format_study(res))
    if not res.ok:
        raise SystemExit(1)
