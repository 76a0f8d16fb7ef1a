"""One board's training run: every learned policy trained, the shield fitted, the folder
exported.

:func:`train_board` trains hidvfs (and its no-shaping ablation) with :mod:`agents.train`,
the GearDVFS and zTT ports with their own learners, fits the shield's predictor
(:mod:`agents.rtmodel`) on the trained policy's calibration episodes, and writes the ONNX
files, their training-time reference outputs and the manifest. Each policy is staged in its
own folder and moved in once complete, so an interrupted run leaves the board folder
consistent; policies may train in forked workers that die with their parent.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import numpy as np

from agents.hidvfs import COOL_FLOOR, HOT_MARGIN_C
from agents.nn import MLP
from agents.rtmodel import collect_rt_jobs, coverage, fit_response_time
from agents.train import (
    CALIB_SEEDS,
    EVAL_SEEDS,
    MAX_EPISODES,
    MAX_SEED,
    MAX_VAL_EPISODES,
    TRAIN_SEEDS,
    VAL_SEEDS,
    HidvfsNets,
    Log,
    MakeMix,
    RunEpisode,
    TrainConfig,
    TrainResult,
    seed_ranges,
    selection_score,
    train_hidvfs,
    validation_seeds,
)
from platforms.spec import BoardSpec

POLICIES = ("hidvfs", "noshaping", "geardvfs", "ztt")


def _ref_inputs(n_in: int, seed: int, n: int = 8) -> np.ndarray:
    return np.random.default_rng([seed, 99]).uniform(-1.0, 2.0, size=(n, n_in)).astype(np.float32)


def _same_net(a: MLP, b: MLP) -> bool:
    return a.sizes == b.sizes and all(np.array_equal(x, y) for x, y in zip(a.params, b.params))


def untrained_warning(pol: str, board: str, tr, seed: int, cfg: TrainConfig) -> str | None:
    """A warning when the networks ``tr`` exports are exactly their seeded initial ones: the
    learner changed nothing (a DQN updates only once its replay holds ``start_samples``
    transitions, zTT 200: a few episodes), so exporting them would ship a random or prior
    network under a trained name. None when they are trained."""
    from agents.geardvfs import BranchDQN

    if pol in ("hidvfs", "noshaping"):
        init = HidvfsNets.init(seed, cfg.hidden, cfg.prior)
        same = [
            k
            for k in ("profiler", "thermal", "priority")
            if _same_net(getattr(tr.nets, k), getattr(init, k))
        ]
        if not same:
            return None
        if len(same) < 3:  # one agent never had a choice: its head was masked to one action
            hint = (
                f" (the thermal agent chooses only between {COOL_FLOOR:g} x a zone's passive "
                f"trip and {HOT_MARGIN_C:g} C below it: train with --hot-fraction above 0)"
                if "thermal" in same
                else ""
            )
            return (
                f"[{pol} {board}] WARNING: the {' and '.join(same)} "
                f"{'network is' if len(same) == 1 else 'networks are'} as initialised after "
                f"{cfg.episodes} episodes: no episode gave {'it' if len(same) == 1 else 'them'} "
                f"a choice{hint}"
            )
        why = "no PPO update changed them"
    else:
        dqn = tr.dqn
        if not _same_net(dqn.q, BranchDQN(dqn.q.sizes[0], dqn.branches, dqn.cfg, seed).q):
            return None
        why = (
            f"{dqn.updates} gradient updates; a DQN learns only once its replay holds "
            f"{dqn.cfg.start_samples} transitions"
        )
    return (
        f"[{pol} {board}] WARNING: the exported network is its untrained initial one after "
        f"{cfg.episodes} episodes ({why}): it learned nothing; retrain with more --episodes"
    )


def best_validation(validation: list[dict]) -> float | None:
    """The best validation score of a run's trained checkpoints (the one it exports; the
    initial networks, scored after 0 episodes, are a reference only), None without any."""
    scores = [v["score"] for v in validation if v["after_episode"] > 0]
    return max(scores) if scores else None


def best_restart(train: Callable[[int], Any], restarts: int, tag: str, log: Log):
    """Runs ``train(r)`` for each restart r and keeps the one whose exported checkpoint scored
    best on the validation mixes (all restarts are scored on the same ones, by the same
    measure, for every policy alike); ties and runs without a score keep the earlier restart.
    Returns the result and what the manifest records of the choice."""
    best, best_score, scores = None, None, []
    for r in range(restarts):
        tr = train(r)
        score = best_validation(tr.validation)
        scores.append(score)
        if best is None or (score is not None and (best_score is None or score > best_score)):
            best, best_score, chosen = tr, score, r
    if restarts > 1:
        shown = ", ".join("-" if x is None else f"{x:+.4f}" for x in scores)
        log(f"{tag} restart {chosen} of {restarts} exported (best validation scores {shown})")
    return best, {"restarts": restarts, "restart": chosen, "restart_scores": scores}


def _train_one(pol, spec, run_episode, make_mix, seed, cfg, out, command, log, commit) -> dict:
    """Train one policy and write its ONNX files into ``out`` (its staging folder, laid out
    as the board folder); returns its manifest entry, reference input/output pairs (for
    ``agents check`` and the loaders) and the files written, relative to ``out``. Runs in the
    caller or in a forked worker."""
    from agents.geardvfs import GEAR_IN, DqnConfig, Selection, train_geardvfs
    from agents.onnx_export import provenance, save_mlp
    from agents.ztt import ZTT_IN, train_ztt, ztt_config

    t0 = time.monotonic()
    ref: dict[str, np.ndarray] = {}
    shield = None

    def meta(role: str, extra=None):
        return provenance(spec.name, role, seed, command, extra, commit)

    def export(net, path, role, prefix, extra):
        save_mlp(net, path, meta(role, extra))
        x = _ref_inputs(net.sizes[0], seed)
        ref[f"{prefix}_x"], ref[f"{prefix}_y"] = x, net.forward(x)

    if pol in ("hidvfs", "noshaping"):
        c = TrainConfig(**{**asdict(cfg), "shaping": pol == "hidvfs"})
        tr, restarts = best_restart(
            lambda r: train_hidvfs(spec, run_episode, make_mix, seed, c, log, restart=r),
            cfg.restarts,
            f"[{pol} {spec.name}]",
            log,
        )
        sub = out if pol == "hidvfs" else out / "noshaping"
        sub.mkdir(parents=True, exist_ok=True)
        prefix = "" if pol == "hidvfs" else "noshaping_"
        for role, net in (
            ("profiler", tr.nets.profiler),
            ("thermal", tr.nets.thermal),
            ("priority", tr.nets.priority),
        ):
            export(net, sub / f"{role}.onnx", role, f"{prefix}{role}", {"sizes": net.sizes})
        entry = {
            "config": tr.config,
            **restarts,
            "wall_s": round(tr.wall_s, 1),
            "p_ref_w": tr.p_ref,
            "validation": tr.validation,
            "first_returns": [round(h.ret, 4) for h in tr.history[: cfg.batch]],
            "last_returns": [round(h.ret, 4) for h in tr.history[-cfg.batch :]],
        }
        if pol == "hidvfs":
            shield = _fit_shield(spec, tr, run_episode, make_mix, seed, c, out, meta, ref, log)
            entry["shield"] = shield
    elif pol in ("geardvfs", "ztt"):
        # the baselines get hidvfs's model selection: the same validation mixes, cadence and
        # score (the unshaped hidvfs return: time, energy, temperature, missed deadlines), so
        # every policy's checkpoint is chosen by one measure
        sel = Selection(
            tuple(validation_seeds(seed, cfg)),
            cfg.val_every,
            selection_score(spec, run_episode, make_mix, seed, cfg),
        )
        if pol == "geardvfs":
            dc = DqnConfig(episodes=cfg.episodes, period_s=cfg.period_s)
            trainer, n_in = train_geardvfs, GEAR_IN
        else:
            dc = ztt_config(cfg.episodes, cfg.period_s)
            trainer, n_in = train_ztt, ZTT_IN
        tr, restarts = best_restart(
            lambda r: trainer(spec, run_episode, make_mix, seed, dc, log, sel, restart=r),
            cfg.restarts,
            f"[{pol} {spec.name}]",
            log,
        )
        export(tr.dqn.q, out / f"{pol}.onnx", pol, pol, {"n_in": n_in})
        entry = {
            "config": {**tr.config, "val_seeds": list(sel.seeds), "val_every": sel.every},
            **restarts,
            "wall_s": round(tr.wall_s, 1),
            "validation": tr.validation,
        }
    else:
        raise ValueError(f"unknown policy {pol!r} to train; known: {', '.join(POLICIES)}")
    warning = untrained_warning(pol, spec.name, tr, seed, cfg)
    if warning is not None:
        entry["untrained"] = True
        entry["warning"] = warning
        log(warning)
    log(f"[{pol} {spec.name}] trained and exported in {time.monotonic() - t0:.0f}s")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.onnx"))
    return {"policy": pol, "entry": entry, "ref": ref, "shield": shield, "files": files}


def _run_forked(
    jobs: list[Callable[[], dict]],
    workers: int,
    on_result: Callable[[int, dict], None] | None = None,
) -> list[dict]:
    """Run ``jobs`` in up to ``workers`` forked processes, results in job order;
    ``on_result(i, result)`` is called in this process as each job's result arrives (a crash
    later keeps what it saved).

    Fork (not spawn): the jobs are closures over the caller's episode runner, which need not be
    picklable; only the results travel back. A worker's exception is re-raised here. Workers
    die with this process: on an exception here (Ctrl-C, or SIGTERM/SIGHUP that the CLI turns
    into one) they are killed, and on Linux the kernel kills them when it dies of anything
    else (``PR_SET_PDEATHSIG``: ``daemon=True`` acts only on a clean interpreter exit).
    """
    import multiprocessing as mp

    from platforms.liveprocs import child_setup

    ctx = mp.get_context("fork")
    results: list[dict | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    running: dict[int, tuple] = {}
    die_with_parent = child_setup(False)  # prctl looked up here, called in the worker

    def start(i: int) -> None:
        recv, send = ctx.Pipe(duplex=False)

        def target() -> None:
            if die_with_parent is not None:
                die_with_parent()
            # the parent stops the workers; a signal to the whole group (Ctrl-C, a service
            # stop) ends them quietly instead of as a worker error raced against the parent's
            for sig in _STOP_SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored by the parent (nohup): ignored here too
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except ValueError:  # not the process's main thread: leave them
                    break
            try:
                send.send(("ok", jobs[i]()))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                send.send(("error", f"{type(exc).__name__}: {exc}"))
            finally:
                send.close()

        proc = ctx.Process(target=target, daemon=True)
        proc.start()
        send.close()
        running[i] = (proc, recv)

    from multiprocessing.connection import wait

    try:
        while pending or running:
            while pending and len(running) < workers:
                start(pending.pop(0))
            ready = wait([r for _, r in running.values()])
            for i, (proc, recv) in list(running.items()):
                if recv not in ready:
                    continue
                try:
                    kind, value = recv.recv()
                except EOFError:
                    kind, value = "error", f"worker exited with code {proc.exitcode}"
                proc.join()
                del running[i]
                if kind == "error":
                    raise RuntimeError(f"training job {i} failed: {value}")
                results[i] = value
                if on_result is not None:
                    on_result(i, value)
    finally:
        for proc, _ in running.values():
            proc.kill()
        for proc, _ in running.values():  # gone before the caller removes their folders
            proc.join(5)
    return results  # type: ignore[return-value]


_STOP_SIGNALS = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)
)


@contextmanager
def _signals_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then act on the first one
    received as it would have acted (KeyboardInterrupt, the CLI's handler, or the default):
    a few renames that must happen together are not cut in the middle. Only in the main
    thread (where handlers live); elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {sig: signal.signal(sig, lambda n, _f: got.append(n)) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if got:
            os.kill(os.getpid(), got[0])


STAGING_PREFIX = ".staging-"


def _remove_stale_staging(out) -> None:
    """Staging folders of trainings that died without cleaning up (their pid is gone, or is
    this process's: a pid reused, as PID 1 in a container restarted after a SIGKILL)."""
    for d in out.glob(f"{STAGING_PREFIX}*"):
        try:
            pid = int(d.name[len(STAGING_PREFIX) :])
            if pid == os.getpid():
                raise ProcessLookupError(pid)
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError, OSError):
            continue


def _fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_policy(out, staged, files: list[str], ref: dict, man: dict) -> None:
    """Put one trained policy in place in the board folder ``out``: its ONNX files (written
    under ``staged`` at their paths relative to ``out``), and the reference.npz and
    manifest.json that describe them with every other policy (``ref``, ``man``).

    Everything is written and fsynced beside the folder first, then renamed into place in one
    short step that signals do not cut (:func:`_signals_deferred`), so the folder holds either
    the policy's old files, reference outputs and manifest entry or its new ones. A crash in
    between (SIGKILL, power) can still leave a mix, which the loaders refuse by comparing each
    network with reference.npz."""
    import json
    from pathlib import Path

    from agents.learned import file_sha256
    from platforms.atomicfile import fsync_dir, write_text_atomic

    out, staged = Path(out), Path(staged)
    hashes = man.setdefault("sha256", {})
    written = {str(rel) for rel in files} | {"reference.npz"}
    for rel in files:
        _fsync_file(staged / rel)
        hashes[str(rel)] = file_sha256(staged / rel)
    ref_tmp = staged.parent / f"{staged.name}.reference.npz"
    with open(ref_tmp, "wb") as f:
        np.savez(f, **ref)
        f.flush()
        os.fsync(f.fileno())
    hashes["reference.npz"] = file_sha256(ref_tmp)
    # files hashed after a training that did not record them (the shipped folders): a file
    # this run wrote is its own now
    later = man.get("sha256_recorded")
    if isinstance(later, dict) and isinstance(later.get("files"), list):
        later["files"] = [f for f in later["files"] if f not in written]
        if not later["files"]:
            del man["sha256_recorded"]
    man_tmp = write_text_atomic(
        staged.parent / f"{staged.name}.manifest.json",
        json.dumps(man, indent=1, sort_keys=True) + "\n",
        mode=0o644,
    )
    dirs = {out}
    with _signals_deferred():
        for rel in files:
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged / rel, dst)
            dirs.add(dst.parent)
        os.replace(ref_tmp, out / "reference.npz")
        os.replace(man_tmp, out / "manifest.json")
    for d in dirs:
        fsync_dir(d)


def train_board(
    spec: BoardSpec,
    run_episode: RunEpisode,
    make_mix: MakeMix,
    seed: int,
    out_dir,
    command: str,
    *,
    episodes: int = 640,
    policies: tuple[str, ...] = POLICIES,
    cfg: TrainConfig | None = None,
    log: Log | None = None,
    workers: int = 1,
) -> dict:
    """Train the requested policies of one board and export them to ``out_dir``.

    The shield needs the hidvfs run: its predictor is fitted on the training episodes' data,
    calibrated on :data:`CALIB_SEEDS` episodes of the trained policy, and its coverage measured
    on held-out :data:`EVAL_SEEDS` episodes with the shield on. ``workers > 1`` trains the
    policies in parallel forked processes; every policy seeds itself, so the networks are the
    same either way. Returns the manifest.
    """
    import json
    from pathlib import Path

    from agents.features import SCHEMA_VERSION, schema
    from agents.hidvfs import ActionSpace
    from agents.onnx_export import git_commit

    for pol in policies:
        if pol not in POLICIES:
            raise ValueError(f"unknown policy {pol!r} to train; known: {', '.join(POLICIES)}")
    log = log or (lambda s: None)
    cfg = cfg or TrainConfig(episodes=episodes)
    if not 0 <= seed <= MAX_SEED or not 1 <= cfg.episodes <= MAX_EPISODES:
        raise ValueError(
            f"seed {seed} / {cfg.episodes} episodes: the seed must be 0-{MAX_SEED} and the "
            f"episodes 1-{MAX_EPISODES}, or the training mixes overlap the calibration, "
            "validation or evaluation mixes"
        )
    if not 0 <= cfg.val_episodes <= MAX_VAL_EPISODES:
        raise ValueError(
            f"{cfg.val_episodes} validation mixes: at most {MAX_VAL_EPISODES}, or they reach "
            "the tuning mixes"
        )
    if not 1 <= cfg.restarts <= MAX_EPISODES // cfg.episodes:
        raise ValueError(
            f"{cfg.restarts} restarts of {cfg.episodes} episodes: at least 1, and at most "
            f"{MAX_EPISODES} episodes in all, or the training mixes overlap the calibration, "
            "validation or evaluation mixes"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    man_path = out / "manifest.json"
    try:
        man = json.loads(man_path.read_text()) if man_path.is_file() else {}
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{man_path}: unreadable ({' '.join(str(err).split())}); it describes the other "
            "policies' files: restore it, or train every policy into a new folder"
        ) from None
    if not isinstance(man, dict):
        raise ValueError(f"{man_path}: not a models manifest (a JSON object); train elsewhere")
    if man.get("board", spec.name) != spec.name:  # never mix two boards' files in one folder
        raise ValueError(
            f"{man_path} holds models of board {man['board']!r}, not {spec.name!r}; "
            "train into another folder (--out)"
        )
    if not man_path.is_file() and any(
        not any(part.startswith(STAGING_PREFIX) for part in p.relative_to(out).parts)
        for p in out.rglob("*.onnx")
    ):  # (a killed run's staging folder is not a model set: it is cleared below)
        # models without the manifest that tells whose they are: training one policy here
        # would label the others' files (and their shield calibration) as this board's
        raise ValueError(
            f"{out} holds ONNX files but no manifest.json: whose models they are cannot be "
            "told; train into an empty or new folder (--out)"
        )
    ref_path = out / "reference.npz"
    ref: dict[str, np.ndarray] = {}
    if ref_path.is_file():
        try:
            with np.load(ref_path) as z:
                ref = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(
                f"{ref_path}: unreadable ({' '.join(str(err).split())}); the other policies' "
                "references are in it: restore it, or train every policy into a new folder"
            ) from None
        was = str(ref["board"]) if "board" in ref else spec.name
        if was != spec.name:
            raise ValueError(
                f"{ref_path} holds the references (and shield calibration) of board {was!r}, "
                f"not {spec.name!r}; train into another folder (--out)"
            )
    ref["board"] = np.array(spec.name)  # the loader checks where the shield calibration is from
    man.update(
        {
            "format": "hidvfs-models",
            "board": spec.name,
            "schema_version": SCHEMA_VERSION,
            "schema": schema(),
            "seed": seed,
            "command": command,
            "period_s": cfg.period_s,
            "action_space": ActionSpace.of(spec).to_json(),
            "seed_ranges": {
                "train": TRAIN_SEEDS,
                "calibration": CALIB_SEEDS,
                "validation": VAL_SEEDS,
                "eval": EVAL_SEEDS,
            },
        }
    )
    man.setdefault("policies", {})

    def save(res: dict) -> None:
        ref.update(res["ref"])
        # which run made this policy's files: the top-level seed/command are the last run's,
        # which may have retrained only some policies (`agents check` compares the files)
        prov = {"seed": seed, "command": command, "git_commit": commit}
        man["policies"][res["policy"]] = {**res["entry"], "provenance": prov}
        if res["shield"] is not None:
            man["shield"] = res["shield"]
        commit_policy(out, staging / res["policy"], res["files"], ref, man)

    commit = git_commit()  # the code that trains, before any output is written

    def job(pol: str) -> Callable[[], dict]:
        return lambda: _train_one(
            pol, spec, run_episode, make_mix, seed, cfg, staging / pol, command, log, commit
        )

    # every policy is written into its own staging folder and moved into the board folder
    # with its reference outputs and manifest entry once it is complete (commit_policy): an
    # interrupted or failed run leaves the finished policies consistent and the rest as
    # they were
    _remove_stale_staging(out)
    staging = out / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir()
    try:
        if workers <= 1 or len(policies) <= 1:
            for pol in policies:  # saved as each finishes: a crash keeps the finished ones
                save(job(pol)())
        else:
            # the slowest first, so the pool drains evenly; each saved as it arrives
            order = sorted(policies, key=lambda p: -_COST.get(p, 1.0))
            _run_forked([job(p) for p in order], workers, lambda _i, res: save(res))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return man


#: relative wall time of each trainer (measured), for ordering parallel work
_COST = {"geardvfs": 2.4, "hidvfs": 2.2, "noshaping": 1.3, "ztt": 1.0}
#: the shield's fit logs its progress every this many calibration / coverage episodes
SHIELD_LOG_EVERY = 32


def _fit_shield(spec, tr: TrainResult, run_episode, make_mix, seed, cfg, out, meta, ref, log):
    from agents.onnx_export import save_sklearn
    from agents.rtfeatures import N_RT, RT_FIELDS
    from agents.runtime import OnnxModel
    from agents.shield import Shield, SplitConformal
    from agents.stages import ShieldStage

    # calibration: the TRAINED policy (greedy, gate on, no shield) on calibration seeds
    def greedy(coll, shield=None):
        return tr.nets.policy(
            spec, gate=True, shield=shield, period_s=cfg.period_s, extra_stages=[coll]
        )

    ranges = seed_ranges(seed, cfg.episodes, cfg.val_episodes, cfg.calib_episodes)
    cal_seeds = list(ranges["calibration"])
    ev_seeds = list(ranges["coverage"])
    n_all = len(cal_seeds) + len(ev_seeds)
    t0 = time.monotonic()

    def progress(phase: str, n: int, before: int) -> Callable[[int], None]:
        """Every SHIELD_LOG_EVERY episodes of a phase: where it is, and the shield's ETA."""

        def tick(k: int) -> None:
            if k % SHIELD_LOG_EVERY and k != n:
                return
            done = before + k
            eta = (time.monotonic() - t0) / done * (n_all - done)
            log(f"[shield {spec.name}] {phase} episode {k}/{n} ETA {eta:.0f}s")

        return tick

    Xc, yc, jc = collect_rt_jobs(
        greedy, run_episode, make_mix, cal_seeds, progress("calibration", len(cal_seeds), 0)
    )
    # the predictor is fitted on the training episodes only: calibration rows stay disjoint;
    # the conformal scores are one per job (see fit_response_time)
    model = fit_response_time(tr.rt_X, tr.rt_y, Xc, yc, cfg.alpha, seed, jobs_cal=jc)
    path = save_sklearn(
        model.estimator,
        N_RT,
        out / "response_time.onnx",
        meta("response_time", {"fields": list(RT_FIELDS), "target": "log remaining response s"}),
    )
    rt = OnnxModel(path, spec.name, "response_time")
    x = tr.rt_X[:16] if len(tr.rt_X) >= 16 else _ref_inputs(N_RT, seed)
    ref["response_time_x"] = x.astype(np.float32)
    ref["response_time_y"] = model.predict(x).astype(np.float32)
    ref["cal_scores"] = model.scores
    # held-out coverage, with the shield on (the executed, certified actions)
    cal = SplitConformal(cfg.alpha).fit(model.scores)

    def pred(z):
        return rt(z).reshape(-1)

    def shielded(coll):
        return greedy(coll, ShieldStage(pred, Shield(pred, cal)))

    Xe, ye, je = collect_rt_jobs(
        shielded,
        run_episode,
        make_mix,
        ev_seeds,
        progress("held-out coverage", len(ev_seeds), len(cal_seeds)),
    )
    cov = coverage(model, Xe, ye)
    cov_jobs = coverage(model, Xe, ye, jobs=je)
    cov_train = coverage(model, Xc, yc, jobs=jc)
    log(
        f"[shield {spec.name}] n_train {model.n_train} n_cal {model.n_cal} jobs q {model.q:.4f} "
        f"(log s) coverage held-out {cov:.3f} of {len(ye)} decisions, {cov_jobs:.3f} of "
        f"{len(np.unique(je))} jobs (target >= {1 - cfg.alpha:.2f})"
    )
    return {
        "alpha": cfg.alpha,
        "q": model.q,
        "q_scale": "log seconds (bound = prediction * exp(q))",
        "n_train": model.n_train,
        "n_cal": model.n_cal,
        "cal_unit": "job",
        "coverage_heldout": cov,
        "n_heldout": int(len(ye)),
        "coverage_heldout_jobs": cov_jobs,
        "n_heldout_jobs": int(len(np.unique(je))),
        "coverage_calibration": cov_train,
        "fields": list(RT_FIELDS),
    }
