"""``hidvfs bots run`` (flags or ``--spec F``, simulated or native): resumable campaigns on any backend."""

from __future__ import annotations

import os
from dataclasses import replace

import click

from daemon.stopsignals import InterruptOnSignals
from tools.common import emit_json, ensure_parent, fail

#: build_spec's "leave the spec's cool-down" (None means no cool-down there)
DEFAULT_COOLDOWN = object()
SIM_IGNORES_BOTS_BIN = "the simulator runs the kernels' DAG models, not the binaries"


def check_bots_bin(path: str | None, what: str = "--bots-bin") -> None:
    """Refuse (exit 2, before anything runs or is stored) a BOTS folder that is missing or
    not a folder; ``what`` names where it came from (``--bots-bin``, a spec's ``bots_bin``)."""
    if not path:
        fail(
            f"{what}: the native backend needs the folder of the BOTS binaries you built (see README)"
        )
    if not os.path.exists(path):
        fail(f"{what} {path}: no such folder (build BOTS there, see README)")
    if not os.path.isdir(path):
        fail(f"{what} {path}: is not a folder (give the BOTS bin/ folder, see README)")


def note_sim_ignores_bots_bin(what: str = "--bots-bin") -> None:
    click.echo(f"note: {what} is ignored with the sim backend ({SIM_IGNORES_BOTS_BIN})", err=True)


def build_spec(
    *,
    backend,
    board,
    bench,
    cls,
    policy,
    seeds,
    bots_bin,
    spec_file,
    deadline_s=None,
    cooldown=DEFAULT_COOLDOWN,
    timeout_s=600.0,
):
    """The campaign of ``spec_file``, or of the flags; ``cooldown`` is a spec's value (a
    mapping, or None for no cool-down), the spec's default when left out."""
    from bots_bench.spec import load_spec, parse_spec

    if spec_file:
        return load_spec(spec_file)
    data = {
        "kernels": "all" if bench == "all" else [b.strip() for b in bench.split(",") if b.strip()],
        "classes": [cls],
        "policies": [p.strip() for p in policy.split(",") if p.strip()],
        "seeds": seeds,
        "board": board,
        "backend": backend,
        "bots_bin": bots_bin,
        "timeout_s": timeout_s,
        "deadline_s": deadline_s,
    }
    if cooldown is not DEFAULT_COOLDOWN:
        data["cooldown"] = cooldown
    return parse_spec(data, "<command line>")


def run_configs(
    configs,
    store,
    *,
    backend,
    sysfs_root="/",
    board=None,
    state_dir=None,
    quiet=False,
    deadline_slack=None,
    say=click.echo,
    profiles_path=None,
    retry_failed=True,
):
    """Run a matrix into ``store`` (skipping what is done); returns the CampaignSummary,
    whose ``keys`` are the stored keys of every selected run. ``store`` may be a function
    that opens it, called once the board is open (a refused start then creates no file).

    Natively each job gets the reference profile of its build stored for the board
    (``registry.job_name``: ``BENCH.CLASS``, ``BENCH.CLASS.VARIANT`` for a variant other than
    the default, ``@LABEL`` appended for a compiler label other than gcc; ``hidvfs bots
    profile [--variant V] [--label L]``); with ``deadline_slack`` its deadline
    is slack x that profile's reference makespan, and a job without a profile is a failed run
    saying so.
    The slack is part of every run's key, so changing it never reuses runs measured without
    it. Native runs are stored under the board detected on ``sysfs_root``; ``board``, when
    given, must be that board. A stored failure is run again unless ``retry_failed`` is
    False (it is how a run whose profile was missing gets its deadline once measured)."""
    from bots_bench.campaign_run import run_pending
    from bots_bench.progress import Progress
    from tools.policies import build_policy_stack

    if deadline_slack is not None:
        configs = [replace(c, deadline_slack=deadline_slack) for c in configs]
    nb = None
    if backend == "native":
        from bots_bench.native import open_board

        nb = open_board(sysfs_root, board, state_dir, say=lambda m: click.echo(m, err=True))
        try:
            configs, run_fn = _native_runs(configs, nb, profiles_path, sysfs_root)
            if callable(store):
                store = store()
        except BaseException:  # a bad profiles file: the board given back before the error
            nb.close()
            raise
    else:
        from bots_bench.campaign_sim import SimRunConfig, run_one

        if callable(store):
            store = store()

        def run_fn(cfg):
            return run_one(
                SimRunConfig(
                    cfg.bench,
                    cfg.cls,
                    cfg.policy,
                    cfg.seed,
                    cfg.board,
                    cfg.deadline_slack,
                    cfg.rep,
                    cfg.deadline_s,
                    cfg.variant,
                ),
                build_policy_stack,
            )

    bar = Progress(len(configs), json_mode=quiet)

    def on_done(cfg, rec):
        bar.done()
        if not rec.get("ok") and not quiet:
            bar.message(f"failed: {cfg.bench}/{cfg.policy}/seed{cfg.seed}: {rec.get('error')}")

    def say(text):  # above the bar on a terminal; a line of its own otherwise (and with --json)
        if bar.enabled:
            bar.message(text)
        else:
            click.echo(text, err=True)

    if nb is not None:
        nb.say = say

    try:
        # SIGTERM and SIGHUP end a campaign as Ctrl-C does: the running kernel killed, the
        # board given back, nothing half done stored
        with InterruptOnSignals():
            summary = run_pending(
                configs,
                run_fn,
                store,
                retry_failed=retry_failed,
                on_skip=lambda cfg: bar.skip(f"{cfg.bench}/{cfg.policy}/seed{cfg.seed}"),
                on_start=lambda cfg: bar.start(f"{cfg.bench}/{cfg.policy}/seed{cfg.seed}"),
                on_done=on_done,
                on_other=lambda cfg: bar.skip(
                    f"{cfg.bench}/{cfg.policy}/seed{cfg.seed} (by another campaign)"
                ),
                on_wait=say,
            )
    finally:
        bar.close()
        if nb is not None:
            nb.close()
    if summary.by_others:
        click.echo(left_to_others(summary, len(configs), store.path), err=True)
    return summary


def refuse_learned_without_agents(policies, board_name: str) -> None:
    """A learned policy on a board hidvfs ships no agents for is refused before any run
    (exit 2); every run of it failed with the loader's "run `hidvfs agents train`", which
    cannot help there: training needs the board's plant parameters."""
    from agents.factory import LEARNED_POLICIES
    from agents.learned import boards_with_agents

    shipped = boards_with_agents()
    learned = sorted({p for p in policies if p in LEARNED_POLICIES})
    if learned and board_name not in shipped:
        fail(
            f"policy {', '.join(learned)}: {'it runs' if len(learned) == 1 else 'these run'} "
            "agents trained for one board, "
            f"and hidvfs ships them for {', '.join(shipped)} only; this board ({board_name}) is "
            "not one of them. Compare kernel governors here (e.g. --policy "
            "schedutil,performance,powersave), or give --board when the board is one of those "
            "and was not detected"
        )


def _native_runs(configs, nb, profiles_path, sysfs_root):
    """The configs of a native campaign on the opened board ``nb`` and the function that runs
    one. Each run's key gets the tree, frequency control and binary it measures
    (:class:`~bots_bench.spec.MeasuredOn`): a re-run on a fake tree, after a first run that
    could not set frequencies (no sudo) or with a rebuilt BOTS measures again instead of
    reusing those runs.

    Each job gets the reference profile of its build stored for the board; with a deadline
    slack, a job without one is a failed run saying how to measure it."""
    from agents import deadlines
    from bots_bench.native import measured_on, run_native
    from bots_bench.registry import DEFAULT_LABEL, job_name
    from daemon.config import DEFAULT_PROFILES
    from tools.policies import build_policy_stack

    board_name = nb.platform.spec.name
    refuse_learned_without_agents([c.policy for c in configs], board_name)
    digests: dict = {}
    configs = [
        replace(c, board=board_name, measured_on=measured_on(c, nb, digests)) for c in configs
    ]
    # the options that make the suggested `bots profile` measure where this campaign looks
    store_opt = (
        ""
        if profiles_path is None or os.path.abspath(profiles_path) == DEFAULT_PROFILES
        else f" --store {profiles_path}"
    )
    root_opt = "" if os.path.abspath(sysfs_root) == "/" else f" --sysfs-root {sysfs_root}"
    profiles_path = profiles_path or DEFAULT_PROFILES
    profiles = deadlines.load(profiles_path, missing_ok=True)

    def run_fn(cfg):
        # the profile of the binary that runs: a cut-off, tied or serial build, or another
        # compiler's, has its own
        name = job_name(cfg.bench, cfg.cls, cfg.variant, cfg.label)
        prof = profiles.find(name, board_name)
        if cfg.deadline_slack is not None:
            if prof is None:
                # the options of the build's name (a default variant or label is left out)
                default = name == job_name(cfg.bench, cfg.cls, label=cfg.label)
                build = "" if default else f" --variant {cfg.variant}"
                build += "" if cfg.label == DEFAULT_LABEL else f" --label {cfg.label}"
                return {
                    "ok": False,
                    "error": (
                        f"no reference profile {name!r} for {board_name} in {profiles_path}, "
                        f"so no deadline can be set: measure it first (sudo hidvfs bots "
                        f"profile --bots-bin {cfg.bots_bin} --bench {cfg.bench} --class "
                        f"{cfg.cls}{build}{store_opt}{root_opt})"
                    ),
                }
            cfg = replace(cfg, deadline_s=cfg.deadline_slack * prof.ref_makespan_s)
        return run_native(cfg, nb, build_policy_stack, profile=prof)

    return configs, run_fn


def interrupted_hint(db: str, opened: bool) -> str:
    """What an interrupted campaign kept: its finished runs in ``db``, resumed by the same
    command again, or nothing (a simulated campaign from flags keeps its runs in memory)."""
    if db == ":memory:":
        return (
            "nothing was kept: a simulated campaign from flags keeps its runs in memory "
            "(pass --db FILE to keep them, and a re-run resumes)"
        )
    if not opened:
        return f"before any run; nothing was stored in {db}"
    return (
        f"the runs finished before it are kept in {db}; the same command again resumes the campaign"
    )


def left_to_others(summary, total: int, path) -> str:
    """The campaign's last progress line when another campaign on the same --db ran some of
    its runs: how many, and who (the table still shows every run)."""
    from bots_bench.claims import describe_owners

    count, who = describe_owners(summary.others)
    other = "another campaign" if count == 1 else f"{count} other campaigns"
    runs = "run was" if summary.by_others == 1 else "runs were"
    who = f" ({who})" if who else ""
    return (
        f"{summary.by_others} of {total} {runs} left to {other} on {path}{who}; "
        f"this campaign ran {summary.executed}"
    )


def campaign_records(store, keys) -> list[dict]:
    """The stored records of a campaign's ``keys``, without their output and time series:
    a table needs neither, and loading every run's blobs of a large results file took more
    than a gigabyte. Narrowed in SQL to the campaign's kernels, policies, boards and
    backends first, then to its exact keys."""
    if not keys:
        return []
    filters = {
        "bench": sorted({k.bench for k in keys}),
        "class": sorted({k.cls for k in keys}),
        "policy": sorted({k.policy for k in keys}),
        "board": sorted({k.board for k in keys}),
        "backend": sorted({k.backend for k in keys}),
    }
    rows = store.runs(filters, with_stdout=False, with_timeseries=False)
    return [r for r in rows if store.key_for(r) in keys]


def run_campaign_cli(
    *,
    backend,
    board,
    bench,
    cls,
    policy,
    seeds,
    db,
    bots_bin,
    spec_file,
    as_json,
    deadline_slack=None,
    sysfs_root="/",
    profiles_path=None,
    retry_failed=True,
    timeout_s=600.0,
    cooldown=DEFAULT_COOLDOWN,
):
    """``hidvfs bots run``: exits 1 after the table when a selected run is not ok.
    ``timeout_s`` and ``cooldown`` (a spec's ``cooldown`` value: a mapping, or None for no
    cool-down) apply to a campaign from flags.

    ``board`` None means: tx2 in the simulator, the detected board natively; a board named
    on the command line or in a spec file must match the native board."""
    from bots_bench.campaign_sim import ratio_table
    from bots_bench.spec import expand
    from bots_bench.store import Store

    if backend == "native" and not spec_file and not bots_bin:
        check_bots_bin(bots_bin)  # refused here, not as a spec error of "<command line>"
    spec = build_spec(
        backend=backend,
        board=board or "tx2",
        bench=bench,
        cls=cls,
        policy=policy,
        seeds=seeds,
        bots_bin=bots_bin,
        spec_file=spec_file,
        timeout_s=timeout_s,
        cooldown=cooldown,
    )
    what = f"{spec_file}: bots_bin" if spec_file else "--bots-bin"
    if spec.backend == "native":  # before anything runs or a failed row per run is stored
        check_bots_bin(spec.bots_bin, what)
    elif spec.bots_bin:
        note_sim_ignores_bots_bin(what)
    configs = expand(spec)
    # a flag-driven simulated campaign keeps no file unless --db names one; a spec file or a
    # native campaign (hours of board time) always lands in a results file
    default_db = ":memory:" if spec.backend == "sim" and not spec_file else "results.sqlite"
    if (db or default_db) != ":memory:":  # its folder made now, before the campaign (the
        # default results.sqlite too: a file there that cannot be written is said now)
        ensure_parent("--db", db or default_db, replace="open")
    stores = []

    def open_store():  # opened once the board is: a refused start leaves no empty file
        stores.append(Store(db or default_db))
        return stores[0]

    explicit = spec_file is not None or board is not None
    try:
        summary = run_configs(
            configs,
            open_store,
            backend=spec.backend,
            sysfs_root=sysfs_root,
            board=spec.board if spec.backend == "sim" or explicit else None,
            quiet=as_json,
            deadline_slack=deadline_slack,
            profiles_path=profiles_path,
            retry_failed=retry_failed,
        )
    except KeyboardInterrupt as err:  # the line the CLI ends with says what was kept
        err.hint = interrupted_hint(db or default_db, opened=bool(stores))
        raise
    store = stores[0]
    records = campaign_records(store, summary.keys)
    if as_json:
        emit_json(
            [
                {k: v for k, v in r.items() if k not in ("series", "stdout", "timeseries")}
                for r in records
            ]
        )
    else:
        click.echo(ratio_table(records, list(spec.policies)))
    if blind := sum(1 for r in records if r.get("frequency_control") is False):
        # the start said so once, before hours of runs; the table must say it too
        click.echo(
            f"note: {blind} of {len(records)} runs could not set CPU frequencies (no writable "
            "cpufreq policy): their governors differ only in affinity and priority, so the "
            "ratios above do not compare frequency policies (run as root on the board)",
            err=True,
        )
    failed = sum(1 for r in records if not r["ok"])
    if failed:
        where = "" if as_json else " (errors above)"
        click.echo(f"{failed} of {len(records)} runs failed{where}", err=True)
        raise SystemExit(1)
