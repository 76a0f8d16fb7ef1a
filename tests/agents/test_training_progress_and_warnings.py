"""What training tells its user: the shield's fit reports progress with an ETA (it ran a
minute in silence), and a policy whose exported network is its untrained initial one (zTT
with a handful of episodes learns nothing before 200 transitions) is flagged, in the log and
in its manifest entry."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np

from agents.learned import check_board, make_hidvfs
from agents.train import TrainConfig
from agents.trainboard import train_board, untrained_warning
from platforms.spec import load_board

RUBIK = load_board("rubikpi3")


def _train(folder, policies, cfg, logs):
    from tools.agents_episodes import EpisodeSpec, episode_items, make_runner

    ep = EpisodeSpec(n_jobs=2)
    return train_board(
        RUBIK,
        make_runner("rubikpi3", ep),
        lambda s: episode_items("rubikpi3", s, ep),
        0,
        folder,
        "test",
        policies=policies,
        cfg=cfg,
        log=logs.append,
    )


def test_the_shield_fit_logs_its_progress_with_an_eta(tmp_path):
    logs: list[str] = []
    folder = tmp_path / "m"
    cfg = TrainConfig(episodes=1, val_episodes=1, calib_episodes=40)
    man = _train(folder, ("hidvfs",), cfg, logs)
    shield = [m for m in logs if m.startswith("[shield rubikpi3]")]
    steps = [re.sub(r"ETA \d+s", "ETA", m) for m in shield if " episode " in m]
    assert steps == [
        "[shield rubikpi3] calibration episode 32/40 ETA",
        "[shield rubikpi3] calibration episode 40/40 ETA",
        "[shield rubikpi3] held-out coverage episode 32/40 ETA",
        "[shield rubikpi3] held-out coverage episode 40/40 ETA",
    ]
    assert shield[-1].startswith("[shield rubikpi3] n_train")  # the summary comes last
    # the folder the run wrote is whole: it loads and passes the check
    assert man["shield"]["n_cal"] > 0
    assert make_hidvfs(RUBIK, models=folder).name == "hidvfs"
    rows = {r["file"]: r for r in check_board("rubikpi3", folder)["files"]}
    assert all(rows[f]["ok"] for f in ("profiler.onnx", "response_time.onnx"))


def test_an_untrained_export_is_flagged_in_the_log_and_the_manifest(tmp_path):
    logs: list[str] = []
    folder = tmp_path / "m"
    _train(folder, ("ztt",), TrainConfig(episodes=1, val_episodes=1), logs)
    (warning,) = [m for m in logs if "WARNING" in m]
    assert warning.startswith("[ztt rubikpi3] WARNING: the exported network is its untrained")
    assert "200 transitions" in warning and "more --episodes" in warning
    entry = json.loads((folder / "manifest.json").read_text())["policies"]["ztt"]
    assert entry["untrained"] is True and entry["warning"] == warning


def test_a_trained_network_is_not_flagged():
    from agents.geardvfs import BranchDQN
    from agents.ztt import ZTT_IN, grid, ztt_config

    cfg = TrainConfig(episodes=8)
    dqn = BranchDQN(ZTT_IN, [len(grid(RUBIK))], ztt_config(8, 0.05), 3)
    tr = SimpleNamespace(dqn=dqn)
    assert "untrained" in untrained_warning("ztt", "rubikpi3", tr, 3, cfg)
    dqn.q.params[0][0, 0] += np.float32(0.01)  # one step of learning
    assert untrained_warning("ztt", "rubikpi3", tr, 3, cfg) is None
    # the hidvfs agents: compared with their seeded prior
    from agents.train import HidvfsNets

    nets = HidvfsNets.init(3, cfg.hidden, cfg.prior)
    tr = SimpleNamespace(nets=nets)
    assert "no PPO update" in untrained_warning("hidvfs", "rubikpi3", tr, 3, cfg)
    nets.priority.params[-1][0] += np.float32(0.01)
    both = untrained_warning("hidvfs", "rubikpi3", tr, 3, cfg)
    assert "the profiler and thermal networks are as initialised" in both
    nets.profiler.params[-1][0] += np.float32(0.01)
    # the shipped models of 2026-12-06 had this: the thermal head was never free in training
    thermal = untrained_warning("hidvfs", "rubikpi3", tr, 3, cfg)
    assert "the thermal network is as initialised" in thermal and "--hot-fraction" in thermal
    nets.thermal.params[0][0, 0] += np.float32(0.01)
    assert untrained_warning("hidvfs", "rubikpi3", tr, 3, cfg) is None
