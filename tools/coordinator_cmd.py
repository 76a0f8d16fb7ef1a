"""Glue for ``hidvfs coordinator``: plain functions the click CLI calls, plus a small argparse
entry (``python -m tools.coordinator_cmd train|evaluate|simulate|serve``) used to produce the
shipped model before the click wiring exists.

Metrics in every table: makespan = last completion - first job arrival; task flow time =
completion - ready time; task wait time = start - ready time (ready = all parents done, or
the job's arrival for a root task), both averaged over tasks.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import math
import os
import stat
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from platforms.cluster.simcluster import parse_nodes_spec
from platforms.errors import HidvfsError
from tools.common import ensure_parent, missing_extra_message

if TYPE_CHECKING:
    from platforms.cluster.alibaba import TraceLoad

DEFAULT_POLICIES = ("higfrl", "fifo", "sjf", "heft", "tetris", "cp", "random")
TOKEN_ENV = "HIDVFS_TELEMETRY_TOKEN"


def parse_policies(text: str) -> list[str]:
    """``all`` or a comma list of policies, case-insensitive, checked before any work (an
    unknown name used to surface only after the trace was read and earlier policies ran)."""
    names = [p.strip().lower() for p in str(text).split(",") if p.strip()]
    known = ", ".join(DEFAULT_POLICIES)
    if not names:
        raise ValueError(f"--policy {text!r} names no policy; expected all or some of {known}")
    # checked before `all` is expanded: `all,hefft` ran every policy and hid the typo
    unknown = [p for p in names if p not in DEFAULT_POLICIES and p != "all"]
    if unknown:
        raise ValueError(f"unknown placement policy {unknown[0]!r}; known: all, {known}")
    if "all" in names:
        return list(DEFAULT_POLICIES)
    return list(dict.fromkeys(names))


def _ratio(value: float, best: float) -> float | None:
    """``value / best``; when the best is 0, 1.0 for a tie and ``None`` (no finite ratio)
    otherwise: a wait of 2 s against a best of 0 used to read as 1.0, as good as the best."""
    if best > 0:
        return value / best
    return 1.0 if value <= 0 else None


def _with_ratios(rows: list[dict], group: str | None = None) -> list[dict]:
    """Add ``*_vs_best`` ratios against the best heuristic (every policy but higfrl; see
    :func:`_ratio` for a best of 0) and the makespan's ratio to its lower bound."""
    for r in rows:
        if r.get("makespan_lb_s"):
            r["makespan_vs_lb"] = r["makespan_s"] / r["makespan_lb_s"]
    keys = ("makespan_s", "mean_flow_s", "mean_wait_s")
    groups = sorted({r.get(group) for r in rows}, key=str) if group else [None]
    for g in groups:
        sub = [r for r in rows if group is None or r.get(group) == g]
        heur = [r for r in sub if r["policy"] != "higfrl"] or sub
        for k in keys:
            best = min(r[k] for r in heur)
            for r in sub:
                r[k.replace("_s", "").replace("mean_", "") + "_vs_best"] = _ratio(r[k], best)
    return rows


def imputed_summary(trace_path: str | os.PathLike[str], load: TraceLoad) -> str:
    """The one warning for filled-in values: each is an info line only (one per value, many
    on a large trace, unseen at the CLI's warning level), yet they change the replay."""
    from platforms.cluster.alibaba import IMPUTED_DEFAULTS

    notes = load.imputed_issues
    n = len(notes)
    used = ", ".join(f"{k} {v:g}" for k, v in IMPUTED_DEFAULTS.items())
    return (
        f"{os.fspath(trace_path)}: {n} empty value{'s' if n != 1 else ''} filled in, in the "
        f"jobs replayed, first at line {min(i.line for i in notes)} ({used})"
    )


def simulate(
    trace_path: str,
    policies: Sequence[str] = DEFAULT_POLICIES,
    nodes_spec: str = "tx2:4,orin-nx:2,rubikpi3:2",
    seed: int = 0,
    compress: float = 1.0,
) -> list[dict]:
    """Replay a ``batch_task.csv`` on the simulated cluster under each policy.

    One row per policy with the simulator's metrics and ratios to the best heuristic; the
    trace's issues (skipped jobs with file, line and reason) are logged and counted
    (``skipped_jobs``, ``dropped_rows``, ``imputed``). ``compress`` replays the arrivals that
    many times faster (:func:`platforms.cluster.simcluster.compress_arrivals`); each row
    says the ``offered_load`` replayed and the ``compress`` factor."""
    from agents.placement.train import make_placer
    from platforms.cluster.alibaba import read_batch_task
    from platforms.cluster.simcluster import Workload, compress_arrivals, offered_load
    from platforms.cluster.simcluster import simulate as run

    # numpy's own error ("expected non-negative integer") named no option
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"--seed: expected an integer >= 0, got {seed!r}")
    if not (isinstance(compress, (int, float)) and 1e-3 <= compress <= 1e6):
        raise ValueError(f"--compress: expected a number from 0.001 to 1000000, got {compress!r}")
    policies = parse_policies(",".join(policies))
    nodes = parse_nodes_spec(nodes_spec)  # all checked before the trace is read
    load = read_batch_task(trace_path)
    if not load.rows:  # "no usable job (0 issues)" did not say why
        raise ValueError(
            f"{trace_path}: holds no rows (the file is empty, or has only a header or blank lines)"
        )
    log = logging.getLogger("hidvfs.coordinator")
    for issue in load.issues:
        (log.warning if issue.warn else log.info)("%s", issue)
    if load.imputed:
        log.warning("%s", imputed_summary(trace_path, load))
    if not load.jobs:
        raise ValueError(f"{trace_path}: no usable job ({len(load.issues)} issues)")
    w = compress_arrivals(Workload.from_jobs(load.jobs), float(compress))
    offered = offered_load(w, nodes)
    rows = []
    for name in policies:
        res = run(w, nodes, make_placer(name), seed=seed)
        rows.append(
            {
                **res.metrics(),
                "trace": os.fspath(trace_path),
                "skipped_jobs": len(load.skipped_jobs),
                "dropped_rows": load.dropped_rows,
                "imputed": load.imputed,
                "seed": seed,
                "compress": float(compress),
                "offered_load": offered,
            }
        )
    if rows and rows[0]["clamped_tasks"]:
        # said once: the count was in --json alone, and these tasks replay lighter than asked
        log.warning(
            "%s: %d tasks ask for more cores or memory than the largest node of --nodes has; "
            "they run as if they asked for that node's (clamped_tasks)",
            os.fspath(trace_path),
            rows[0]["clamped_tasks"],
        )
    return _with_ratios(rows)


def _ratio_cell(x: float | None) -> str:
    """A ratio for the table; ``inf`` where the best is 0 and this one is not."""
    return "inf" if x is None else f"{x:.4f}"


def format_table(rows: list[dict]) -> str:
    """A text table: per policy (and load, when present) the metrics and ratios to the best
    heuristic."""
    if not rows:
        return "(no rows)"
    if "makespan_vs_best" not in rows[0] and "flow_vs_best" not in rows[0]:
        rows = _with_ratios([dict(r) for r in rows], "load" if "load" in rows[0] else None)
    has_load = "load" in rows[0]
    head = (["load"] if has_load else []) + [
        "policy",
        "tasks",
        "makespan_s",
        "flow_s",
        "wait_s",
        "mk/best",
        "flow/best",
        "wait/best",
        "mk/lb",
    ]
    lines = []
    for r in rows:
        cells = ([f"{r['load']:g}"] if has_load else []) + [
            str(r["policy"]),
            str(int(r.get("tasks", 0))),
            f"{r['makespan_s']:.1f}",
            f"{r['mean_flow_s']:.2f}",
            f"{r['mean_wait_s']:.2f}",
            _ratio_cell(r["makespan_vs_best"]),
            _ratio_cell(r["flow_vs_best"]),
            _ratio_cell(r["wait_vs_best"]),
            f"{r.get('makespan_vs_lb', float('nan')):.4f}",
        ]
        lines.append(cells)
    width = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in width)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in width))]
    out += [fmt.format(*c) for c in lines]
    out.append(
        "makespan = last completion - first arrival; flow = completion - ready; wait = start - ready"
        " (task means); lb = the makespan no placement can beat (longest chain after its arrival"
        " at the fastest speed, or the work still to arrive over the cluster's capacity);"
        " inf: the best is 0 and this one is not"
    )
    if "offered_load" in rows[0]:
        r = rows[0]
        out.append(
            f"offered load {r['offered_load']:.3g} (the jobs' work per second of their arrival"
            f" span over the cluster's capacity), arrivals {r['compress']:g}x as fast as the"
            " trace's"
            + (
                "; below ~0.5 every placement nears the lower bound: try --compress"
                if r["offered_load"] < 0.5
                else ""
            )
        )
    return "\n".join(out)


def _token(token: str | None) -> str | None:
    if token:
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    cred = os.environ.get("CREDENTIALS_DIRECTORY")  # systemd LoadCredential=
    if cred and os.path.exists(os.path.join(cred, "telemetry-token")):
        with open(os.path.join(cred, "telemetry-token"), encoding="utf-8") as f:
            return f.read().strip() or None
    return None


#: how long a stop waits for the requests being answered (the unit's TimeoutStopSec is 10)
DRAIN_S = 5.0


def serve(
    host: str = "127.0.0.1",
    port: int = 8888,
    policy: str = "higfrl",
    nodes=None,
    token: str | None = None,
    timeout_s: float = 0.5,
    model_path=None,
) -> None:
    """Run the scheduler extender until SIGTERM, SIGINT or SIGHUP, then close its socket and
    telemetry and return (systemd's stop was a death by SIGTERM, rc 143, with neither).
    ``nodes``: ``"name=board@url,..."``."""
    import threading

    from daemon.coordinator import build_server
    from daemon.stopsignals import StopOnSignals

    log = logging.getLogger("hidvfs.coordinator")
    srv = build_server(
        host, port, policy, nodes, token=_token(token), timeout_s=timeout_s, model_path=model_path
    )
    h, p = srv.server_address[:2]
    log.info("extender on http://%s:%d (policy %s)", f"[{h}]" if ":" in h else h, p, policy)
    # the server runs in a thread: the signal only sets the event here, and shutdown() called
    # from the thread in serve_forever would wait for itself
    thread = threading.Thread(target=srv.serve_forever, name="extender", daemon=True)
    try:
        with StopOnSignals() as signals:
            thread.start()
            while thread.is_alive() and not signals.stop.wait(0.5):
                pass
        log.info("%s: extender stopped", signals.received or "server ended")
    finally:
        if thread.is_alive():
            srv.shutdown()
        # a pod being scored gets its answer (its telemetry reads end within timeout_s): a
        # stop in the middle of a prioritize was a RemoteDisconnected for the scheduler
        if left := srv.drain(DRAIN_S):
            log.warning("%d requests still being answered after %g s: closed", left, DRAIN_S)
        srv.server_close()
        srv.coordinator.telemetry.close()


def resolve_train_out(out, shipped, why_not_shipped: str | None = None) -> str:
    """The file ``train`` will write, checked writable *before* training (a bad ``--out``
    used to fail only at export, after minutes of training).

    ``why_not_shipped``: ``None`` for the run that reproduces the shipped model (the default
    configuration: ``--seed 0``, the full budget), else the option that makes it another
    model (``"--iterations"``, ``"--seed 3"``). Such a run needs ``--out`` and may not name
    the shipped file: it would replace it silently (a full-budget run with another seed
    used to)."""
    if out is not None and not os.fspath(out).strip():
        raise ValueError("--out: empty path; give the ONNX file to write")
    rule = (
        "only `hidvfs coordinator train --seed 0` with the full default budget reproduces "
        f"the shipped model {shipped}"
    )
    if out is None:
        if why_not_shipped is not None:
            raise ValueError(f"--out is required with {why_not_shipped}: {rule}")
        out = shipped
    path = os.path.abspath(os.fspath(out))
    if why_not_shipped is not None and os.path.realpath(path) == os.path.realpath(
        os.fspath(shipped)
    ):
        raise ValueError(
            f"--out {out}: is the shipped model, which a run with {why_not_shipped} may not "
            f"replace ({rule})"
        )
    if os.path.isdir(path):
        raise ValueError(f"--out {out}: is a directory; give the ONNX file to write")
    # its folder made (or refused) before training; the export is renamed over a file there
    ensure_parent("--out", out, replace="rename")
    return os.fspath(out)


def train(
    seed: int = 0, out: str | None = None, iterations: int | None = None, quiet: bool = False
) -> str:
    """Train ``higfrl`` in the simulated cluster and export the ONNX model (with the source
    tree's git commit in its metadata); returns its path."""
    from agents.onnx_export import git_commit
    from agents.placement.higfrl import DEFAULT_MODEL
    from agents.placement.train import TrainConfig, export
    from agents.placement.train import train as run

    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"--seed: expected an integer >= 0, got {seed!r}")
    if iterations is not None and (not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"--iterations: expected an integer >= 1, got {iterations!r}")
    # the export at the end imports onnx: say so before training, not after it
    missing = missing_extra_message("hidvfs coordinator train", "cluster", ("onnx",))
    if missing:
        raise ValueError(missing)
    kw = {"seed": seed} if iterations is None else {"seed": seed, "iterations": iterations}
    cfg = TrainConfig(**kw)
    shipped_cfg = TrainConfig()  # the configuration the shipped model was trained with
    if cfg.iterations != shipped_cfg.iterations:
        why_not_shipped = "--iterations"
    elif cfg.seed != shipped_cfg.seed:
        why_not_shipped = f"--seed {seed}"
    else:
        why_not_shipped = None
    out = resolve_train_out(out, DEFAULT_MODEL, why_not_shipped)
    commit = git_commit()  # the code that trains (read before training, not at export)
    t0 = time.monotonic()

    def log(row):
        if not quiet:
            print(
                json.dumps(
                    {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
                    | {"elapsed_s": round(time.monotonic() - t0, 1)}
                ),
                file=sys.stderr,
                flush=True,
            )

    model, history = run(cfg, log)
    command = f"hidvfs coordinator train --seed {seed}" + (
        "" if iterations is None else f" --iterations {iterations}"
    )
    date = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    extra = {"train_seconds": f"{time.monotonic() - t0:.1f}", "git_commit": commit}
    export(model, out, cfg, command, date, history, extra)
    return out


def synth(
    out: str, n_jobs: int = 500, seed: int = 0, load: float = 0.7, nodes: str | None = None
) -> dict:
    """Write a synthetic ``batch_task.csv`` (Alibaba v2018 format, no header) whose arrivals
    offer ``load`` times the capacity of the ``nodes`` cluster; returns what was written."""
    from agents.placement.train import DEFAULT_NODES
    from platforms.atomicfile import write_text_atomic, written_as_stream
    from platforms.cluster.simcluster import capacity
    from platforms.cluster.synthetic import SyntheticConfig, generate_rows
    from platforms.outputs import open_output

    spec = parse_nodes_spec(nodes or DEFAULT_NODES)
    # written by a rename over the file a link there leads to (below): only a link this user
    # or root placed where nobody else could (another user's is refused)
    ensure_parent("--out", out, replace="rename", follow=True)
    rows = generate_rows(
        SyntheticConfig(n_jobs=n_jobs, seed=seed, load=load, capacity=capacity(spec))
    )
    text = "\n".join(rows) + "\n"
    if written_as_stream(out):  # /dev/stdout, a FIFO: written as it is (a rename replaces it)
        with open_output(out, "--out") as f:
            f.write(text.encode("utf-8"))
    else:
        target = os.path.realpath(out)  # a link's target is written, the link kept
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)  # a file replaced keeps its mode
        except FileNotFoundError:
            mode = 0o644
        write_text_atomic(target, text, mode=mode)
    return {"out": os.fspath(out), "jobs": n_jobs, "tasks": len(rows), "seed": seed, "load": load}


def check_model(model_path: str | os.PathLike[str] | None = None) -> dict:
    """What ``coordinator check`` reports: the loader's verdict on the file (signature,
    feature version, a warm-up run, the reference outputs) and its provenance."""
    from agents.placement.higfrl import DEFAULT_MODEL
    from agents.placement.onnx_mlp import OnnxPolicyModel

    path = os.fspath(model_path or DEFAULT_MODEL)
    report: dict = {"file": path, "ok": False}
    if not os.path.isfile(path):
        report["error"] = "no such file" if not os.path.exists(path) else "not a file"
        return report
    try:
        m = OnnxPolicyModel(path)
    except ValueError as err:
        report["error"] = str(err).removeprefix(f"{path}: ")
        return report
    meta = m.metadata
    return report | {
        "ok": True,
        "max_abs_diff": m.reference_diff,
        "feature_version": meta.get("feature_version"),
        "seed": meta.get("seed"),
        "command": meta.get("command"),
        "date": meta.get("date"),
        "git_commit": meta.get("git_commit"),
    }


def evaluate(
    model_path=None,
    n_jobs: int = 500,
    loads: Sequence[float] = (0.7, 1.0, 1.2),
    seeds: Sequence[int] | None = None,
    nodes: str | None = None,
) -> list[dict]:
    """Held-out comparison (see :func:`agents.placement.train.evaluate`), summarised per load."""
    from agents.placement import train as t

    rows = t.evaluate(
        model_path,
        n_jobs=n_jobs,
        loads=loads,
        seeds=seeds or t.EVAL_SEEDS,
        nodes=nodes or t.DEFAULT_NODES,
    )
    # the ratios again, as simulate's: summarize gives 1.0 where the best is 0
    return _with_ratios(t.summarize(rows), "load")


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low`` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {text!r}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def parse_loads(text: str) -> list[float]:
    """``--loads``: a comma list of finite loads > 0 (0, -1, nan or abc used to run, or fail
    deep in the trace generator)."""
    loads = []
    for part in str(text).split(","):
        try:
            x = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a number") from None
        if not math.isfinite(x) or x <= 0:
            raise argparse.ArgumentTypeError(f"expected finite loads > 0, got {part.strip()}")
        loads.append(x)
    return loads


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.coordinator_cmd")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--iterations", type=_int_at_least(1))
    p.add_argument("--out")
    p.add_argument("--quiet", action="store_true")
    p = sub.add_parser("evaluate")
    p.add_argument("--model")
    p.add_argument("--jobs", type=_int_at_least(10), default=500)
    p.add_argument("--loads", type=parse_loads, default="0.7,1.0,1.2")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("simulate")
    p.add_argument("--trace", required=True)
    p.add_argument("--policy", default=",".join(DEFAULT_POLICIES))
    p.add_argument("--nodes", default="tx2:4,orin-nx:2,rubikpi3:2")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--compress", type=float, default=1.0)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("serve")
    p.add_argument("--listen", default="127.0.0.1:8888")
    p.add_argument("--policy", default="higfrl")
    p.add_argument("--nodes", default="")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(a)
    except (ValueError, OSError, HidvfsError) as err:  # one line, no traceback (as the CLI)
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace) -> int:
    if a.cmd == "train":
        t0 = time.monotonic()
        path = train(a.seed, a.out, a.iterations, a.quiet)
        print(f"wrote {path} in {time.monotonic() - t0:.1f} s")
    elif a.cmd == "evaluate":
        rows = evaluate(a.model, a.jobs, a.loads)
        print(json.dumps(rows, indent=1) if a.json else format_table(rows))
    elif a.cmd == "simulate":
        rows = simulate(a.trace, parse_policies(a.policy), a.nodes, a.seed, a.compress)
        print(json.dumps(rows, indent=1) if a.json else format_table(rows))
    else:
        from daemon.config import parse_listen

        host, port = parse_listen(a.listen)
        serve(host, port, a.policy.strip().lower(), a.nodes or None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
