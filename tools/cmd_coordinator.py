"""``hidvfs coordinator simulate|synth|serve|train|check|evaluate``: DAG job placement across boards."""

from __future__ import annotations

import json

import click

from tools.common import FiniteFloatRange, Friendly, emit_json, not_empty, stops_on_signals


@click.group("coordinator", cls=Friendly)
def coordinator() -> None:
    """Place DAG jobs across a fleet of boards running the daemon.

    `simulate` replays an Alibaba cluster-trace-v2018 batch_task.csv on a simulated cluster;
    `serve` is a Kubernetes scheduler extender (filter/prioritize) scoring nodes from their
    daemons' live telemetry.
    """


@coordinator.command("simulate")
@click.option(
    "--trace",
    "trace_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="batch_task.csv, or batch_task.csv.gz (a first line of the column names is skipped).",
)
@click.option(
    "--policy",
    default="all",
    show_default=True,
    help="all, or a comma list of higfrl,fifo,sjf,heft,tetris,cp,random.",
    metavar="POLICIES",
)
@click.option(
    "--nodes",
    default="tx2:4,orin-nx:2,rubikpi3:2",
    show_default=True,
    help="Cluster: board[:count][:cpus=N][:mem=X][:speed=S],... with each field at most once: "
    "count >= 1 (10000 nodes in all), cpus whole cores 1-1024, mem > 0 in the trace's "
    "plan_mem units (one unit read as 1 GB; default the board's, 8 or 16), speed per core "
    "0.01-100 (reference core 1.0).",
    metavar="NODES",
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Seed of the simulation.",
)
@click.option(
    "--compress",
    default=1.0,
    show_default=True,
    type=click.FloatRange(1e-3, 1e6),
    help="Replay the jobs' arrivals this many times faster (their work unchanged): a trace "
    "of a large, lightly loaded cluster becomes a loaded one on a few boards. The table "
    "says the offered load.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows.")
def simulate_cmd(trace_path, policy, nodes, seed, compress, as_json) -> None:
    """Side-by-side makespan, mean flow and wait time per policy, with ratios to the best
    heuristic, and the offered load replayed."""
    from daemon.logs import setup_logging
    from tools.coordinator_cmd import format_table, parse_policies, simulate

    setup_logging("warning")  # the trace's skipped jobs and dropped rows, on stderr
    rows = simulate(trace_path, parse_policies(policy), nodes, seed, compress)
    if as_json:
        emit_json(rows)
    else:
        click.echo(format_table(rows))


@coordinator.command("synth")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    callback=not_empty,
    help="CSV file to write (its folder is made; an existing file is replaced, keeping its "
    "mode, a link's target written); /dev/stdout or a pipe is written as a stream, and the "
    "line saying what was written then goes to stderr.",
)
@click.option(
    "--jobs",
    "n_jobs",
    default=500,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Jobs in the trace (100 000: about 30 s and 400 MB).",
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Seed of the trace (the same seed writes the same file).",
)
@click.option(
    "--load",
    default=0.7,
    show_default=True,
    type=FiniteFloatRange(0.01, 10.0),
    help="Offered load: core-seconds of work arriving per second over the --nodes cluster's "
    "capacity (cores x speed).",
)
@click.option(
    "--nodes",
    default="tx2:4,orin-nx:2,rubikpi3:2",
    show_default=True,
    callback=not_empty,
    help="The cluster the load is relative to (as simulate's --nodes).",
    metavar="NODES",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def synth_cmd(out, n_jobs, seed, load, nodes, as_json) -> None:
    """Write a synthetic batch_task.csv in the Alibaba cluster-trace-v2018 format: DAG jobs
    shaped as the published trace statistics describe (mostly gather trees, some scatter, a few
    independent task_* jobs; log-normal durations), Poisson arrivals. The traces the
    coordinator is trained and evaluated on come from the same generator (other seeds); it is
    also a way to try `simulate` without the real trace."""
    from platforms.outputs import is_stream_path
    from tools.coordinator_cmd import synth

    # its errors (a bad --nodes, an --out that cannot be written) are one `hidvfs: error:`
    # line, exit 2, as every command's (the group turns them into it)
    row = synth(out, n_jobs=n_jobs, seed=seed, load=load, nodes=nodes)
    # a trace written to stdout (or a pipe) keeps it clean: what was written goes to stderr
    stream = is_stream_path(out)
    if as_json and not stream:
        emit_json(row)
    elif as_json:
        click.echo(json.dumps(row), err=True)
    else:
        click.echo(
            f"{row['out']}: {row['jobs']} jobs, {row['tasks']} tasks (seed {seed}, load {load:g})",
            err=stream,
        )


@coordinator.command("serve")
@click.option(
    "--listen",
    default="127.0.0.1:8888",
    show_default=True,
    help="HOST:PORT of the extender.",
    metavar="HOST:PORT",
)
@click.option(
    "--policy",
    default="higfrl",
    show_default=True,
    help="Placement policy used to score nodes: higfrl, fifo, sjf, heft, tetris, cp or random.",
    metavar="POLICY",
)
@click.option(
    "--nodes",
    default=None,
    help="name=board@http://host:port/status,... (each node's daemon telemetry); "
    "name=board without a URL, or name=@url with the board from the node's hidvfs.io/board "
    "label (docs/k3s-extender.md).",
    metavar="NODES",
)
@click.option(
    "--token",
    default=None,
    help="Bearer token for remote telemetry (or HIDVFS_TELEMETRY_TOKEN).",
    metavar="TOKEN",
)
def serve_cmd(listen, policy, nodes, token) -> None:
    """Run the scheduler extender (filter and prioritize verbs) until interrupted."""
    from daemon.config import parse_listen
    from daemon.logs import setup_logging
    from tools.coordinator_cmd import serve

    try:
        host, port = parse_listen(listen)
    except ValueError as err:
        raise ValueError(f"--listen: {err}") from None
    setup_logging("info")  # startup, per-node telemetry reasons, neutral scores
    serve(host, port, policy.strip().lower(), nodes, token=token)


@coordinator.command("train")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0), help="Training seed.")
@click.option(
    "--out",
    default=None,
    type=click.Path(dir_okay=False),
    help="ONNX file, checked writable before training (default: the shipped model, only for "
    "--seed 0 at the full budget, which reproduces it; required with another --seed or "
    "--iterations).",
)
@click.option(
    "--iterations",
    default=None,
    type=click.IntRange(1),
    help="Training iterations (default: the full budget).",
)
@stops_on_signals
def train_cmd(seed, out, iterations) -> None:
    """Train the higfrl actor-critic in the simulated cluster and export it to ONNX."""
    from tools.coordinator_cmd import train

    click.echo(train(seed=seed, out=out, iterations=iterations))


@coordinator.command("check")
@click.option(
    "--model",
    "model_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    callback=not_empty,
    help="higfrl ONNX file (default: the shipped model).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check_cmd(model_path, as_json) -> None:
    """Verify the higfrl model loads, has the placer's inputs, outputs and feature version, and
    reproduces the training-time network's outputs on its recorded reference inputs to 1e-5
    (relative where an output exceeds 1 in magnitude). Exit 1 when it does not."""
    from tools.common import fail
    from tools.coordinator_cmd import check_model

    report = check_model(model_path)
    if as_json:
        emit_json(report)
    elif report["ok"]:
        click.echo(
            f"{report['file']} ok max|diff| {report['max_abs_diff']:.2e} "
            f"feature_version {report['feature_version']} seed {report['seed']} "
            f"commit {report['git_commit'] or '?'}"
        )
    else:
        click.echo(f"{report['file']} FAIL {report['error']}")
    if not report["ok"]:
        fail("model check failed", code=1)


@coordinator.command("evaluate")
@click.option(
    "--jobs",
    "n_jobs",
    default=500,
    show_default=True,
    type=click.IntRange(10),
    help="Jobs per held-out trace (500: about 7 minutes on 2 cores).",
)
@click.option(
    "--model",
    "model_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="higfrl ONNX file (default: the shipped model).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows.")
@stops_on_signals
def evaluate_cmd(n_jobs, model_path, as_json) -> None:
    """higfrl against every heuristic on held-out synthetic traces, including a high load."""
    from tools.coordinator_cmd import evaluate

    rows = evaluate(model_path=model_path, n_jobs=n_jobs)
    if as_json:
        emit_json(rows)
    else:
        for r in rows:
            click.echo(
                "  ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                )
            )


COMMAND = coordinator
