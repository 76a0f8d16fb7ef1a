"""``hidvfs bots list|run|report|study``: BOTS campaigns on the simulated or the real board."""

from __future__ import annotations

import click

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
@click.option("--backend", type=click.Choice(["sim", "native"]), default="sim", show_default=True, help="Simulated board or the real one.")
@click.option("--board", default="tx2", show_default=True, help="Board spec (sim) or board override (native).")
@click.option("--bench", default="all", show_default=True, help="Kernels: all, or a comma list (fib,sort,...).")
@click.option("--class", "cls", default="small", show_default=True, help="Input class (test, small, medium, ...).")
@click.option("--policy", default="performance,schedutil,powersave", show_default=True, help="Comma list of policies; ratios are to the first.")
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1, 1000), help="Seeds 0..N-1 per kernel and policy.")
@click.option("--deadline-slack", default=None, type=click.FloatRange(min=1.0), help="Give each job a deadline of SLACK x its reference makespan.")
@click.option("--db", default=None, type=click.Path(dir_okay=False), help="SQLite results store; runs already in it are skipped.")
@click.option("--bots-bin", default=None, type=click.Path(file_okay=False), help="Folder with BOTS binaries (native).")
@click.option("--spec", "spec_file", default=None, type=click.Path(exists=True, dir_okay=False), help="Campaign spec YAML instead of flags.")
@click.option("--json", "as_json", is_flag=True, help="Print the run records as a JSON list.")
def run_cmd(backend, board, bench, cls, policy, seeds, deadline_slack, db, bots_bin, spec_file, as_json) -> None:
    """Run a campaign and print run records (--json) or a table with ratios to the first policy."""
    from agents.factory import parse_policy_list
    from bots_bench.campaign_sim import SimRunConfig, ratio_table, run_one
    from tools.policies import build_policy_stack

    if spec_file or backend == "native":
        from tools.native_campaign import run_campaign_cli

        run_campaign_cli(backend=backend, board=board, bench=bench, cls=cls, policy=policy,
                         seeds=seeds, db=db, bots_bin=bots_bin, spec_file=spec_file,
                         as_json=as_json, deadline_slack=deadline_slack)
        return
    policies = parse_policy_list(policy)
    kernels = _kernels(bench)
    from bots_bench.dags import CLASSES

    for k in kernels:
        if cls not in CLASSES[k]:
            fail(f"kernel {k} has no class {cls!r}; its classes: {', '.join(CLASSES[k])}")
    configs = [SimRunConfig(k, cls, p, s, board, deadline_slack) for k in kernels for p in policies for s in range(seeds)]
    store = None
    done = set()
    if db:
        from bots_bench.store import ResultStore

        store = ResultStore(db)
        done = store.done_keys()
    from bots_bench.progress import Progress

    records = []
    with Progress(len(configs), quiet=as_json) as bar:
        for cfg in configs:
            key = store.key_for(_as_run_dict(cfg)) if store else None
            if store and key in done:
                bar.skip(f"{cfg.bench}/{cfg.policy}/seed{cfg.seed}")
                continue
            bar.start(f"{cfg.bench}/{cfg.policy}/seed{cfg.seed}")
            rec = run_one(cfg, build_policy_stack)
            records.append(rec)
            if store:
                store.add(rec)
            bar.advance()
    if store:
        records = [r for r in store.runs({"backend": "sim", "board": board}) if r["policy"] in policies and r["bench"] in kernels]
    if as_json:
        emit_json([{k: v for k, v in r.items() if k != "series"} for r in records])
    else:
        click.echo(ratio_table(records, policies))


def _as_run_dict(cfg) -> dict:
    return {"bench": cfg.bench, "class": cfg.cls, "policy": cfg.policy, "seed": cfg.seed,
            "board": cfg.board, "backend": "sim", "rep": cfg.rep}
