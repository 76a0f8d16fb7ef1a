"""The BOTS builds a campaign can run: the serial versions (``KERNEL.gcc.serial``), the ``for``
and ``single`` versions of alignment and sparselu in the simulator (which used to run the
default model under the variant's name), the refusal of what the simulator does not model,
and how to build what the top-level ``make`` of BOTS leaves out (knapsack, concom)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bots_bench import registry
from bots_bench.dags import generate
from bots_bench.native import needs_separate_check, open_board, run_native
from bots_bench.spec import RunConfig, expand, parse_spec
from bots_bench.store import Store
from platforms.errors import SpecError
from platforms.faketree import write_fake_tree
from platforms.spec import load_board
from tests.bots_bench.outputs import sparselu_serial_block
from tools.native_campaign import run_configs
from tools.policies import build_policy_stack

README = Path(__file__).resolve().parents[2] / "README.md"


def _sim(**kw):
    data = {
        "kernels": ["sparselu"],
        "classes": ["test"],
        "policies": ["performance"],
        "seeds": 1,
        "board": "tx2",
        "backend": "sim",
        **kw,
    }
    return parse_spec(data, "camp.yaml")


def _tasks(spec) -> dict[str, int]:
    store = Store(":memory:")
    run_configs(expand(spec), store, backend="sim", quiet=True)
    rows = store.runs()
    assert all(r["ok"] for r in rows), [r["error"] for r in rows]
    return {r["bench"]: r["tasks"] for r in rows}


# --- the simulator runs the variant it stores ------------------------------------------------
def test_a_sim_campaign_runs_the_model_of_its_variant():
    kernels = ["sparselu", "alignment"]
    default = _tasks(_sim(kernels=kernels))
    for_ = _tasks(_sim(kernels=kernels, variant="for-omp-tasks"))
    single = _tasks(_sim(kernels=kernels, variant="single-omp-tasks"))
    for k in kernels:
        assert for_[k] == generate(k, "test", variant="for").n != default[k]
        assert single[k] == default[k] == generate(k, "test").n  # single is the default build


def test_a_sim_campaign_of_the_serial_variant_runs_one_task():
    assert _tasks(_sim(kernels=["fft", "sparselu"], variant="serial")) == {
        "fft": 1,
        "sparselu": 1,
    }


@pytest.mark.parametrize(
    "variant", ["omp-tasks-tied", "omp-tasks-manual", "for-omp-tasks-tied", "omp-tasks-final"]
)
def test_a_sim_spec_refuses_a_variant_without_a_model(variant):
    with pytest.raises(SpecError) as e:
        _sim(kernels=["sparselu", "fib"], variant=variant)
    assert e.value.key == "variant" and e.value.got == variant
    assert "sparselu: omp-tasks, single-omp-tasks, for-omp-tasks, serial" in str(e.value)
    # the same builds natively are fine: there the binary is what runs
    native = _sim(kernels=["sparselu"], variant=variant, backend="native", bots_bin="bin")
    assert native.variant == variant


def test_a_sim_spec_refuses_a_thread_count_it_would_not_simulate():
    with pytest.raises(SpecError) as e:
        _sim(threads=2)
    assert e.value.key == "threads" and "backend sim" in str(e.value)
    assert _sim(threads=2, backend="native", bots_bin="bin").threads == 2


def test_model_variants():
    from bots_bench.dags import model_variant, modelled_builds

    assert model_variant("fib", "omp-tasks") is None
    assert model_variant("fib", "serial") == "serial"
    assert model_variant("sparselu", "for-omp-tasks") == "for"
    assert model_variant("alignment", "single-omp-tasks") == "single"
    assert modelled_builds("fib") == ("omp-tasks", "serial")
    for bad in ("omp-tasks-tied", "for-omp-tasks-tied", "serial-omp-tasks"):
        with pytest.raises(ValueError, match="modelled builds: omp-tasks"):
            model_variant("sparselu", bad)


# --- the serial builds natively -------------------------------------------------------------
@pytest.mark.parametrize(
    ("kernel", "name"),
    [
        ("fft", "fft.gcc.serial"),
        ("fib", "fib.gcc.serial"),
        ("sparselu", "sparselu.gcc.serial"),  # one serial version: no single/for
        ("alignment", "alignment.gcc.serial"),
    ],
)
def test_serial_binary_names(kernel, name):
    assert registry.binary_name(kernel, "serial") == name


def test_a_serial_build_has_no_sub_version():
    with pytest.raises(registry.RegistryError, match="bad BOTS variant 'single-serial'"):
        registry.binary_name("sparselu", "single-serial")


def _exe(folder: Path, name: str, script: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def test_serial_command_line_and_checks(tmp_path):
    b = tmp_path / "bin"
    for k in ("fib", "sort", "sparselu"):
        _exe(b, f"{k}.gcc.serial")
    fib = registry.command_for("fib", "small", b, 4, variant="serial")
    assert fib.argv[1:] == ["-n", "10", "-v", "0", "-o", "3"]  # no -x, no -c (fib's is n/a)
    assert fib.env["OMP_NUM_THREADS"] == "4"  # harmless: a serial build does not read it
    assert registry.command_for("sort", "smoke", b, 1, variant="serial").check  # a real check
    lu = registry.command_for("sparselu", "smoke", b, 1, variant="serial")
    assert not lu.check  # timed as is: no separate -c run either
    assert not needs_separate_check(
        RunConfig("sparselu", "smoke", "maxfreq", 0, "tx2", "native", 0, variant="serial")
    )
    assert needs_separate_check(RunConfig("sparselu", "smoke", "maxfreq", 0, "tx2", "native", 0))
    found = registry.find_binaries(b)
    assert found["fib"] == {"serial": b / "fib.gcc.serial"}


def test_a_native_spec_accepts_the_serial_variant():
    spec = _sim(kernels="all", variant="serial", backend="native", bots_bin="bin")
    assert {c.variant for c in expand(spec)} == {"serial"}


def test_a_serial_run_of_a_stand_in_is_a_good_run(tmp_path):
    # the serial sparselu prints its Program without "(Single version)"
    block = sparselu_serial_block(0.5)
    _exe(tmp_path / "bin", "sparselu.gcc.serial", f"echo \"argv: $*\"\nprintf '{block}'\n")
    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    nb = open_board(str(root), None, str(tmp_path / "state"), say=lambda m: None)
    cfg = RunConfig(
        "sparselu",
        "smoke",
        "maxfreq",
        0,
        "tx2",
        "native",
        0,
        variant="serial",
        bots_bin=str(tmp_path / "bin"),
        cooldown=None,
    )
    try:
        rec = run_native(cfg, nb, build_policy_stack)
    finally:
        nb.close()
    assert rec["ok"], rec["error"]
    assert rec["argv"][0].endswith("sparselu.gcc.serial") and "-c" not in rec["argv"]
    assert "verified_separately" not in rec and rec["time_program_s"] == 0.5


# --- building what the top-level make leaves out --------------------------------------------
@pytest.mark.parametrize("kernel", ["knapsack", "concom"])
def test_a_missing_knapsack_or_concom_says_how_to_build_it(tmp_path, kernel):
    with pytest.raises(registry.RegistryError) as e:
        registry.binary_path(kernel, tmp_path)
    assert f"make -C omp-tasks/{kernel}" in str(e.value)
    assert "top-level make" in str(e.value)


def test_a_missing_serial_binary_says_how_to_build_it(tmp_path):
    with pytest.raises(registry.RegistryError, match=r"make -C serial/fft"):
        registry.binary_path("fft", tmp_path, "serial")


def test_the_readme_build_builds_knapsack_and_concom():
    section = README.read_text().split("## BOTS campaigns", 1)[1]
    build = section.split("```sh", 1)[1].split("```", 1)[0]  # its first commands
    assert "./configure --compiler gcc" in build
    assert "make -C omp-tasks/knapsack" in build and "make -C omp-tasks/concom" in build
