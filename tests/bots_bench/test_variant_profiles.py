"""A reference profile belongs to one binary: a build other than the default (a cut-off, tied or
serial build) is stored under its own name, ``KERNEL.CLASS.VARIANT``, measured by
``hidvfs bots profile --variant V``, and a native campaign of that variant plans its deadline
from it. Profiles used to be keyed by ``KERNEL.CLASS`` alone, so a campaign of
``omp-tasks-manual`` with --deadline-slack planned its deadline, gate and shield from the default
binary's profile. Another compiler's build (a spec's ``label: clang``) is another binary too: its
profile is stored as ``KERNEL.CLASS@LABEL`` (``KERNEL.CLASS.VARIANT@LABEL``), measured by
``hidvfs bots profile --label L``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from agents import deadlines
from bots_bench import native, registry
from bots_bench.native import run_native
from bots_bench.spec import RunConfig, expand, parse_spec
from bots_bench.store import Store
from platforms.errors import SpecError
from platforms.faketree import write_fake_tree
from platforms.observation import JobProfile
from platforms.spec import load_board
from tests.bots_bench.outputs import fib_block, sparselu_serial_block
from tools.cli import cli
from tools.native_campaign import run_configs
from tools.policies import build_policy_stack

FIB = fib_block(0.01)
#: the serial sparselu cannot check: -c would turn its n/a into a failed verification
SPARSELU_SERIAL = sparselu_serial_block(0.01)


def _native_run(configs, tree, tmp_path, profiles) -> dict:
    """The one run of a native campaign of ``configs`` on the fake ``tree`` with deadlines at
    1.5 x the profiles in ``profiles``."""
    db = Store(":memory:")
    run_configs(
        configs,
        db,
        backend="native",
        sysfs_root=str(tree),
        state_dir=str(tmp_path / "state"),
        quiet=True,
        deadline_slack=1.5,
        profiles_path=str(profiles),
        say=lambda m: None,
    )
    (rec,) = db.runs()
    return rec


def _stand_in(folder, name, block, log=None):
    """A binary that prints ``block`` (and appends its name to ``log`` when given)."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    mark = f"echo {name} >> '{log}'\n" if log else ""
    path.write_text(f"#!/bin/sh\n{mark}printf '{block}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def registered(monkeypatch) -> list:
    """The job entries a native run registers with the daemon's job table, in order."""
    entries = []
    real = native.JobTable.register

    def spy(self, entry):
        entries.append(entry)
        return real(self, entry)

    monkeypatch.setattr(native.JobTable, "register", spy)
    return entries


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    write_fake_tree(load_board("tx2"), root)
    return root


# --- the names --------------------------------------------------------------------------------
def test_a_variant_other_than_the_default_has_a_profile_name_of_its_own():
    assert registry.job_name("fib", "small") == "fib.small"  # stores made before keep working
    assert registry.job_name("fib", "small", registry.DEFAULT_VARIANT) == "fib.small"
    assert registry.job_name("fib", "small", "omp-tasks-manual") == "fib.small.omp-tasks-manual"
    assert registry.job_name("fib", "small", "serial") == "fib.small.serial"
    assert registry.job_name("fib", "t40", "omp-tasks-if_clause-tied") == (
        "fib.t40.omp-tasks-if_clause-tied"
    )
    # one binary, one name: sparselu's omp-tasks is its single version
    assert registry.job_name("sparselu", "small", "single-omp-tasks") == "sparselu.small"
    assert registry.job_name("sparselu", "small", "for-omp-tasks") == "sparselu.small.for-omp-tasks"
    assert (
        registry.job_name("sparselu", "small", "single-omp-tasks-tied")
        == registry.job_name("sparselu", "small", "omp-tasks-tied")
        == "sparselu.small.omp-tasks-tied"
    )
    names = {
        registry.job_name("fib", "small", v) for v in ("omp-tasks", "omp-tasks-tied", "serial")
    }
    assert len(names) == 3
    for name in names:
        assert deadlines.check_name(name) == name  # the job registry takes it
    with pytest.raises(registry.RegistryError, match="bad BOTS variant"):
        registry.job_name("fib", "small", "omp-tasks-bogus")


def test_a_compiler_label_other_than_the_default_has_a_profile_name_of_its_own():
    gcc = registry.DEFAULT_LABEL
    assert registry.job_name("fib", "small", label=gcc) == "fib.small"  # stores made before
    assert registry.job_name("fib", "small", "serial", gcc) == "fib.small.serial"
    assert registry.job_name("fib", "small", label="clang") == "fib.small@clang"
    assert registry.job_name("fib", "small", "omp-tasks-manual", "clang") == (
        "fib.small.omp-tasks-manual@clang"
    )
    assert registry.job_name("sparselu", "small", "single-omp-tasks", "clang") == (
        "sparselu.small@clang"
    )
    names = {registry.job_name("fib", "small", label=lab) for lab in ("gcc", "clang", "icc")}
    assert len(names) == 3
    for name in names:
        assert deadlines.check_name(name) == name  # the job registry takes it
    # a dot or an @ would make two builds' names alike: refused, by a spec too
    for bad in ("clang.17", "gcc@clang", ""):
        with pytest.raises(registry.RegistryError, match="bad compiler label"):
            registry.job_name("fib", "small", label=bad)
        with pytest.raises(SpecError) as e:
            _manual_campaign("bin", label=bad)
        assert e.value.key == "label" and e.value.got == bad


# --- a native campaign of a variant -----------------------------------------------------------
def _manual_campaign(bots_bin, **extra):
    spec = parse_spec(
        {
            "kernels": ["fib"],
            "classes": ["smoke"],
            "policies": ["performance"],
            "seeds": 1,
            "board": "tx2",
            "backend": "native",
            "bots_bin": str(bots_bin),
            "timeout_s": 30.0,
            "cooldown": None,
            "threads": 2,
            "variant": "omp-tasks-manual",
            **extra,
        }
    )
    return expand(spec)


def _profiles(path, *profiles):
    store = deadlines.ProfileStore()
    for p in profiles:
        store.put("tx2", p)
    deadlines.save(store, path)
    return path


def test_a_native_campaign_of_a_variant_plans_from_that_variant_s_profile(
    tree, tmp_path, registered
):
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks-manual", FIB)
    default = JobProfile("fib.smoke", 0.5, 0.05, 0.1, 0.4, 2035200, 4)
    manual = JobProfile("fib.smoke.omp-tasks-manual", 0.3, 0.03, 0.1, 0.2, 2035200, 4)

    def campaign(profiles):
        return _native_run(_manual_campaign(tmp_path / "bin"), tree, tmp_path, profiles)

    rec = campaign(_profiles(tmp_path / "both.json", default, manual))
    assert rec["ok"], rec["error"]
    assert rec["deadline_s"] == pytest.approx(1.5 * 0.2)  # the manual build's, not 1.5 x 0.4
    # the job registers under the name of the profile it carries
    (entry,) = registered
    assert entry.name == "fib.smoke.omp-tasks-manual"
    assert entry.profile is not None and entry.profile.name == entry.name
    assert entry.profile.ref_makespan_s == pytest.approx(0.2)

    # only the default build's profile: a failed run naming the command that measures it
    rec = campaign(_profiles(tmp_path / "default.json", default))
    assert not rec["ok"]
    assert "no reference profile 'fib.smoke.omp-tasks-manual'" in rec["error"]
    # the store and the tree it was asked for, so that the command measures where the
    # campaign looks (without them it measured / into the default store)
    store = tmp_path / "default.json"
    assert (
        f"--bench fib --class smoke --variant omp-tasks-manual --store {store} --sysfs-root {tree})"
        in rec["error"]
    )


def test_a_default_campaign_s_missing_profile_message_names_no_variant(tree, tmp_path):
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks", FIB)
    configs = [replace(c, variant="omp-tasks") for c in _manual_campaign(tmp_path / "bin")]
    rec = _native_run(configs, tree, tmp_path, tmp_path / "none.json")
    assert "no reference profile 'fib.smoke'" in rec["error"]
    assert rec["error"].endswith(
        f"--bench fib --class smoke --store {tmp_path / 'none.json'} --sysfs-root {tree})"
    )


@pytest.mark.parametrize(
    ("variant", "name", "options"),
    [
        ("omp-tasks", "fib.smoke@clang", "--class smoke --label clang"),
        (
            "omp-tasks-manual",
            "fib.smoke.omp-tasks-manual@clang",
            "--class smoke --variant omp-tasks-manual --label clang",
        ),
    ],
    ids=["default-variant", "manual"],
)
def test_a_native_campaign_of_a_label_plans_from_that_label_s_profile(
    tree, tmp_path, registered, variant, name, options
):
    _stand_in(tmp_path / "bin", f"fib.clang.{variant}", FIB)
    gcc = JobProfile(registry.job_name("fib", "smoke", variant), 0.5, 0.05, 0.1, 0.4, 2035200, 4)
    clang = JobProfile(name, 0.3, 0.03, 0.1, 0.2, 2035200, 4)

    def campaign(profiles):
        configs = _manual_campaign(tmp_path / "bin", variant=variant, label="clang")
        return _native_run(configs, tree, tmp_path, profiles)

    rec = campaign(_profiles(tmp_path / "both.json", gcc, clang))
    assert rec["ok"], rec["error"]
    assert rec["deadline_s"] == pytest.approx(1.5 * 0.2)  # the clang build's, not 1.5 x 0.4
    (entry,) = registered
    assert entry.name == name and entry.profile.name == name

    # only the gcc build's profile: a failed run naming the command that measures clang's
    rec = campaign(_profiles(tmp_path / "gcc.json", gcc))
    assert not rec["ok"]
    assert f"no reference profile {name!r}" in rec["error"]
    where = f"--store {tmp_path / 'gcc.json'} --sysfs-root {tree})"
    assert rec["error"].endswith(f"--bench fib {options} {where}")


def test_a_native_study_of_a_variant_hands_the_job_that_variant_s_profile(
    tree, tmp_path, monkeypatch
):
    from tools.native_study import native_runner

    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks-manual", FIB)
    profiles = _profiles(
        tmp_path / "p.json",
        JobProfile("fib.smoke", 0.5, 0.05, 0.1, 0.4, 2035200, 4),
        JobProfile("fib.smoke.omp-tasks-manual", 0.3, 0.03, 0.1, 0.2, 2035200, 4),
    )
    handed = []
    real = run_native

    def spy(cfg, nb, build, profile=None):
        handed.append((cfg.variant, profile))
        return real(cfg, nb, build, profile)

    monkeypatch.setattr("tools.native_study.run_native", spy)
    runner, nb = native_runner(
        "tx2",
        "smoke",
        str(tmp_path / "bin"),
        str(tree),
        slack=None,
        profiles_path=str(profiles),
        variant="omp-tasks-manual",
    )
    try:
        rec = runner("fib", 0, "performance")
    finally:
        nb.close()
    assert rec["ok"], rec["error"]
    ((variant, prof),) = handed
    assert variant == "omp-tasks-manual" and prof.name == "fib.smoke.omp-tasks-manual"


# --- `hidvfs bots profile --variant` ----------------------------------------------------------
def _profile_args(tmp_path, tree, store, *extra):
    return [
        "bots",
        "profile",
        "--bots-bin",
        str(tmp_path / "bin"),
        "--class",
        "smoke",
        "--store",
        str(store),
        "--sysfs-root",
        str(tree),
        "--board",
        "tx2",
        "--state-dir",
        str(tmp_path / "state"),
        "--socket",
        str(tmp_path / "none.sock"),
        "--json",
        *extra,
    ]


def test_bots_profile_measures_a_variant_under_its_own_name(tree, tmp_path):
    log = tmp_path / "ran.log"
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks", FIB, log)
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks-manual", FIB, log)
    store = tmp_path / "profiles.json"
    r = CliRunner().invoke(cli, _profile_args(tmp_path, tree, store, "--bench", "fib"))
    assert r.exit_code == 0, r.output
    assert set(log.read_text().split()) == {"fib.gcc.omp-tasks"}
    log.unlink()
    r = CliRunner().invoke(
        cli,
        _profile_args(tmp_path, tree, store, "--bench", "fib", "--variant", "omp-tasks-manual"),
    )
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    assert row["ok"] and row["name"] == "fib.smoke.omp-tasks-manual"
    assert set(log.read_text().split()) == {"fib.gcc.omp-tasks-manual"}  # the build timed
    db = deadlines.load(store)
    assert db.find("fib.smoke", "tx2").version == 1  # the default's profile is left as it was
    assert db.find("fib.smoke.omp-tasks-manual", "tx2").version == 1


def test_bots_profile_measures_a_label_under_its_own_name(tree, tmp_path):
    log = tmp_path / "ran.log"
    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks", FIB, log)
    _stand_in(tmp_path / "bin", "fib.clang.omp-tasks", FIB, log)
    _stand_in(tmp_path / "bin", "fib.clang.omp-tasks-manual", FIB, log)
    store = tmp_path / "profiles.json"
    for extra, name, binary in (
        (("--label", "clang"), "fib.smoke@clang", "fib.clang.omp-tasks"),
        (
            ("--label", "clang", "--variant", "omp-tasks-manual"),
            "fib.smoke.omp-tasks-manual@clang",
            "fib.clang.omp-tasks-manual",
        ),
    ):
        r = CliRunner().invoke(cli, _profile_args(tmp_path, tree, store, "--bench", "fib", *extra))
        assert r.exit_code == 0, r.output
        (row,) = json.loads(r.stdout)
        assert row["ok"] and row["name"] == name
        assert set(log.read_text().split()) == {binary}  # the build timed
        log.unlink()
    db = deadlines.load(store)
    assert db.find("fib.smoke", "tx2") is None  # the gcc build's is not measured
    assert db.find("fib.smoke@clang", "tx2").version == 1
    assert db.find("fib.smoke.omp-tasks-manual@clang", "tx2").version == 1


def test_bots_profile_of_a_serial_build_that_cannot_check_makes_no_check_run(tree, tmp_path):
    """sparselu's -c also runs the sequential version, so its omp-tasks builds are verified by
    one untimed -c run; its serial build cannot check (Verification = n/a), and a -c run of
    it would fail the profile."""
    _stand_in(tmp_path / "bin", "sparselu.gcc.serial", SPARSELU_SERIAL)
    store = tmp_path / "profiles.json"
    r = CliRunner().invoke(
        cli, _profile_args(tmp_path, tree, store, "--bench", "sparselu", "--variant", "serial")
    )
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    assert row["ok"] and row["name"] == "sparselu.smoke.serial"
    assert deadlines.load(store).find("sparselu.smoke.serial", "tx2") is not None


def test_bots_profile_refuses_a_bad_variant_before_the_board_is_opened(tree, tmp_path, monkeypatch):
    import tools.cmd_profile as cp

    def opened(*a, **kw):
        raise AssertionError("a measuring session was opened")

    monkeypatch.setattr(cp, "MeasureSession", opened)
    (tmp_path / "bin").mkdir()
    r = CliRunner().invoke(
        cli,
        _profile_args(tmp_path, tree, tmp_path / "p.json", "--bench", "fib", "--variant", "tied"),
    )
    assert r.exit_code == 2 and "--variant tied: bad BOTS variant 'tied'" in r.output, r.output
    r = CliRunner().invoke(cli, ["bots", "profile", "--help"])
    assert "--variant" in r.output and "BENCH.CLASS.VARIANT" in r.output


def test_bots_profile_refuses_a_bad_label_before_the_board_is_opened(tree, tmp_path, monkeypatch):
    import tools.cmd_profile as cp

    def opened(*a, **kw):
        raise AssertionError("a measuring session was opened")

    monkeypatch.setattr(cp, "MeasureSession", opened)
    (tmp_path / "bin").mkdir()
    args = _profile_args(tmp_path, tree, tmp_path / "p.json", "--bench", "fib")
    r = CliRunner().invoke(cli, [*args, "--label", "gcc@clang"])
    assert r.exit_code == 2 and "--label gcc@clang: bad compiler label" in r.output, r.output
    r = CliRunner().invoke(cli, ["bots", "profile", "--help"])
    assert "--label" in r.output and "BENCH.CLASS@clang" in r.output


def test_the_serial_profile_name_is_the_one_a_run_registers_under(board, tmp_path, monkeypatch):
    """run_native registers the job under the name of the profile it was given."""
    _stand_in(tmp_path / "bin", "fib.gcc.serial", FIB)
    names = []
    real = native.JobTable.register
    monkeypatch.setattr(
        native.JobTable, "register", lambda self, e: names.append(e.name) or real(self, e)
    )
    cfg = RunConfig(
        "fib",
        "smoke",
        "maxfreq",
        0,
        "tx2",
        "native",
        0,
        threads=1,
        variant="serial",
        bots_bin=str(tmp_path / "bin"),
        cooldown=None,
        check=False,
    )
    rec = run_native(cfg, board, build_policy_stack)
    assert rec["ok"], rec["error"]
    assert names == ["fib.smoke.serial"]


def test_the_missing_profile_hint_names_only_the_options_that_differ(tree, tmp_path, monkeypatch):
    """The default store is left out of the suggested `bots profile` (it is its default);
    another store and a fake tree are named, so that it measures where the campaign looks."""
    import agents.deadlines as deadlines
    from daemon.config import DEFAULT_PROFILES

    _stand_in(tmp_path / "bin", "fib.gcc.omp-tasks", FIB)
    configs = [replace(c, variant="omp-tasks") for c in _manual_campaign(tmp_path / "bin")]
    real_load = deadlines.load
    monkeypatch.setattr(
        deadlines, "load", lambda path, **kw: real_load(tmp_path / "none.json", **kw)
    )
    errors = [
        _native_run(configs, tree, tmp_path, store)["error"]
        for store in (DEFAULT_PROFILES, tmp_path / "mine.json")
    ]
    assert errors[0].endswith(f"--bench fib --class smoke --sysfs-root {tree})")
    assert errors[1].endswith(
        f"--class smoke --store {tmp_path / 'mine.json'} --sysfs-root {tree})"
    )
