"""The daemon's start path needs only the runtime dependencies: no scikit-learn, matplotlib,
skl2onnx or onnx (those are the train/report extras)."""

import json
import subprocess
import sys

HEAVY = ("sklearn", "matplotlib", "skl2onnx", "onnx", "scipy")


def test_daemon_start_path_imports_no_heavy_extra():
    code = (
        "import sys, json\n"
        "import tools.cli, daemon.service, daemon.loop, tools.simdaemon\n"
        "from agents.factory import make_policy_stack\n"
        "from platforms.spec import load_board\n"
        "make_policy_stack('schedutil', load_board('tx2'))\n"
        "try:\n"
        "    make_policy_stack('hidvfs', load_board('tx2'))\n"
        "except Exception:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
