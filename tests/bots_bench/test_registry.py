"""Kernel registry: names, classes, binary discovery and the command line, run for real."""

from __future__ import annotations

import os
import signal
import stat
import subprocess

import pytest

from bots_bench import registry
from bots_bench.parser import parse_output, verification_ok
from bots_bench.registry import RegistryError, binary_name, command_for, find_binaries

EXPECTED = (
    "alignment concom fft fib floorplan health knapsack nqueens sort sparselu strassen uts".split()
)


def test_the_twelve_kernels():
    assert sorted(registry.KERNEL_NAMES) == EXPECTED
    assert set(registry.CHECK_USES_SEQ_RESULT) == {
        "alignment",
        "concom",
        "fft",
        "knapsack",
        "sparselu",
        "strassen",
    }
    for k in registry.KERNELS.values():
        assert "test" in k.classes and "smoke" in k.classes, k.name
    # every Program string maps back to exactly one kernel
    assert len(registry.PROGRAMS) == sum(len(k.programs) for k in registry.KERNELS.values())
    assert registry.kernel_for_program("Unbalance Tree Search") == "uts"
    assert registry.kernel_for_program("SparseLU (For version)") == "sparselu"
    assert registry.kernel_for_program("nope") is None


def test_class_table_matches_the_reference():
    ic = registry.input_class
    assert ic("fib", "large").args == ("-n", "53") and ic("fib", "large").cutoff == 20
    assert ic("sparselu", "medium").args == ("-n", "75", "-m", "100")
    assert ic("uts", "medium").stacksize == "55M" and ic("uts", "test").stacksize == "2M"
    assert ic("knapsack", "large").input_file == "knapsack-044.input"
    assert ic("alignment", "medium").input_file == "prot.100.aa"
    assert ic("nqueens", "medium").cutoff == 8
    assert ic("concom", "small").unlimited_stack


@pytest.mark.parametrize(
    ("kernel", "variant", "name"),
    [
        ("fib", "omp-tasks", "fib.gcc.omp-tasks"),
        ("fib", "omp-tasks-manual", "fib.gcc.omp-tasks-manual"),
        ("fib", "omp-tasks-if_clause-tied", "fib.gcc.omp-tasks-if_clause-tied"),
        ("sparselu", "omp-tasks", "sparselu.gcc.single-omp-tasks"),
        ("sparselu", "for-omp-tasks", "sparselu.gcc.for-omp-tasks"),
        ("alignment", "for-omp-tasks-tied", "alignment.gcc.for-omp-tasks-tied"),
        ("alignment", "omp-tasks", "alignment.gcc.single-omp-tasks"),
    ],
)
def test_binary_names(kernel, variant, name):
    assert binary_name(kernel, variant) == name


@pytest.mark.parametrize(
    ("kernel", "variant", "msg"),
    [
        ("fib", "for-omp-tasks", "no 'for' version"),
        ("fib", "omp-task", "bad BOTS variant"),
        ("fib", "omp-tasks-fast", "bad BOTS variant"),
        ("fibo", "omp-tasks", "unknown BOTS kernel 'fibo'"),
    ],
)
def test_bad_variants(kernel, variant, msg):
    with pytest.raises(RegistryError, match=msg):
        binary_name(kernel, variant)


def test_a_bad_variant_lists_the_variants_and_the_prefixes_of_its_kernel():
    with pytest.raises(RegistryError) as e:
        binary_name("fib", "omp-task")
    assert "expected one of omp-tasks, omp-tasks-tied, omp-tasks-manual," in str(e.value)
    assert str(e.value).endswith("omp-tasks-final-tied, or serial")
    assert "[" not in str(e.value) and "prefixed" not in str(e.value)  # fib has no for/single
    with pytest.raises(RegistryError) as e:
        binary_name("sparselu", "omp-task")
    assert "omp-tasks-final-tied (each optionally prefixed by single- or for-), or serial" in str(
        e.value
    )


def test_unknown_class_names_the_kernel_classes():
    with pytest.raises(RegistryError, match=r"kernel 'fib' has no input class 'huge'.*t40"):
        registry.input_class("fib", "huge")


def test_find_binaries(bots_tree, tmp_path):
    found = find_binaries(bots_tree.bin)
    assert set(found) == set(EXPECTED)
    assert set(found["fib"]) == {"omp-tasks", "omp-tasks-manual"}
    assert set(found["sparselu"]) == {"single-omp-tasks", "for-omp-tasks"}
    assert found["fft"] == {}
    assert found["uts"]["omp-tasks"] == bots_tree.bin / "uts.gcc.omp-tasks"

    # a non-executable file, a foreign name and another label
    d = tmp_path / "bin"
    d.mkdir()
    (d / "fib.gcc.omp-tasks").write_text("")
    (d / "README").write_text("")
    exe = d / "sort.icc.omp-tasks-tied"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    found = find_binaries(d)
    assert found["fib"] == {} and found["sort"] == {"omp-tasks-tied": exe}
    assert find_binaries(d, label="gcc")["sort"] == {}
    assert all(v == {} for v in find_binaries(tmp_path / "missing").values())


def test_command_line_and_env(bots_tree):
    argv, env = command_for("fib", "smoke", bots_tree.bin, 2, base_env={"PATH": "/bin"})
    assert argv == [
        str(bots_tree.bin / "fib.gcc.omp-tasks"),
        "-n",
        "25",
        "-v",
        "0",
        "-o",
        "3",
        "-c",
    ]
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}

    cmd = command_for("sparselu", "smoke", bots_tree.bin, 3)
    assert "-c" not in cmd.argv and not cmd.check  # -c would run the sequential LU too
    assert cmd.argv[0].endswith("sparselu.gcc.single-omp-tasks")
    assert command_for("sparselu", "smoke", bots_tree.bin, 3, check=True).check
    assert command_for("fib", "smoke", bots_tree.bin, 1, check=False).argv[-1] == "3"
    assert cmd.env["OMP_NUM_THREADS"] == "3" and cmd.env.get("PATH") == os.environ.get("PATH")

    # the cut-off goes only to the cut-off builds
    plain = command_for("fib", "small", bots_tree.bin, 1)
    manual = command_for("fib", "small", bots_tree.bin, 1, variant="omp-tasks-manual")
    assert "-x" not in plain.argv
    assert manual.argv[1:5] == ["-n", "10", "-x", "5"]

    uts = command_for("uts", "test", bots_tree.bin, 2)
    assert uts.argv[1:3] == ["-f", str(bots_tree.inputs / "uts" / "test.input")]
    assert uts.env["OMP_STACKSIZE"] == "2M"


def test_missing_things_are_named(bots_tree, tmp_path):
    with pytest.raises(RegistryError) as e:
        command_for("fft", "smoke", bots_tree.bin, 1)
    assert str(e.value) == (
        f"binary fft.gcc.omp-tasks not found under {bots_tree.bin}; build BOTS there (see README)"
    )
    with pytest.raises(RegistryError, match="uts/large not found at .*large.input"):
        command_for("uts", "large", bots_tree.bin, 1)
    with pytest.raises(RegistryError, match="threads must be a positive integer"):
        command_for("fib", "smoke", bots_tree.bin, 0)
    d = tmp_path / "bin"
    d.mkdir()
    (d / "fib.gcc.omp-tasks").write_text("")
    with pytest.raises(RegistryError, match="not executable"):
        command_for("fib", "smoke", d, 1)


def _run(cmd, timeout=60):
    return subprocess.run(cmd.argv, env=cmd.env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("kernel", "cls", "variant"),
    [
        ("fib", "smoke", "omp-tasks"),
        ("fib", "test", "omp-tasks-manual"),
        ("sort", "smoke", "omp-tasks"),
        ("sparselu", "smoke", "omp-tasks"),
        ("sparselu", "smoke", "for-omp-tasks"),
        ("concom", "smoke", "omp-tasks"),
        ("uts", "test", "omp-tasks"),
    ],
)
def test_the_test_kernels_run_and_verify(bots_tree, kernel, cls, variant):
    cmd = command_for(kernel, cls, bots_tree.bin, 2, variant=variant, check=True)
    if kernel == "fib" and cls == "test":  # fib 35 is too slow for the unit tests
        cmd.argv[cmd.argv.index("35")] = "22"
    p = _run(cmd)
    assert p.returncode == 0, p.stdout + p.stderr
    res = parse_output(p.stdout)
    assert res.kernel == kernel and res.threads == 2
    assert res.verification == "successful" and verification_ok(res, cmd.check)
    assert res.time_program_s > 0
    assert (res.time_sequential_s is not None) == registry.kernel(kernel).check_runs_sequential
    if variant == "omp-tasks-manual":
        assert res.cutoff == "manual (10)"
    if kernel == "uts":
        assert res.nodes == bots_tree.uts_test_nodes


def test_the_kernels_really_check(bots_tree):
    """Fault 'bad' corrupts the result: the real check prints UNSUCCESSFUL, the exit is 0."""
    for kernel in ("fib", "sort", "sparselu", "concom", "uts"):
        cls = "test" if kernel == "uts" else "smoke"
        cmd = command_for(kernel, cls, bots_tree.bin, 2, check=True)
        cmd.env["BOTS_TEST_FAULT"] = "bad"
        p = _run(cmd)
        assert p.returncode == 0
        res = parse_output(p.stdout)
        assert res.verification == "UNSUCCESSFUL", kernel
        assert not verification_ok(res, True)


def test_unknown_expectation_is_na(bots_tree):
    cmd = command_for("uts", "tiny", bots_tree.bin, 1, check=True)
    res = parse_output(_run(cmd).stdout)
    assert res.verification == "n/a" and not verification_ok(res, True)


def test_hang_and_crash_faults(bots_tree):
    cmd = command_for("fib", "smoke", bots_tree.bin, 1)
    cmd.env["BOTS_TEST_FAULT"] = "hang"
    with pytest.raises(subprocess.TimeoutExpired):
        _run(cmd, timeout=1.0)
    cmd.env["BOTS_TEST_FAULT"] = "segv"
    p = _run(cmd)
    assert p.returncode == -signal.SIGSEGV


def test_bots_exit_statuses(bots_tree):
    fib = str(bots_tree.binary("fib.gcc.omp-tasks"))
    bad = subprocess.run([fib, "-q"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 100 and "Unrecognized parameter" in bad.stdout
    # the plain build rejects a cut-off, as BOTS does
    assert subprocess.run([fib, "-x", "3"], capture_output=True, timeout=30).returncode == 100
    assert subprocess.run([fib, "-v", "2"], capture_output=True, timeout=30).returncode == 100


def test_binaries_that_are_there_but_not_executable_are_found_apart(tmp_path):
    """`bots list` shows them as such (`bots run` says "not executable"); find_binaries, which
    the runs use, still leaves them out. A variant found executable under another compiler's
    label keeps VARIANT for that one and gives this one its @LABEL."""
    for name, mode in (
        ("fib.gcc.omp-tasks", 0o644),
        ("fib.gcc.serial", 0o755),
        ("sort.clang.omp-tasks", 0o644),
        ("sort.gcc.omp-tasks", 0o755),
    ):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(mode)
    (tmp_path / "nqueens.gcc.omp-tasks").mkdir(mode=0o755)  # a folder is no binary at all
    found = find_binaries(tmp_path)
    assert found["fib"] == {"serial": tmp_path / "fib.gcc.serial"}
    assert found["sort"] == {"omp-tasks": tmp_path / "sort.gcc.omp-tasks"}
    lost = registry.find_unexecutable(tmp_path)
    assert set(lost) == set(EXPECTED)
    assert lost["fib"] == {"omp-tasks": tmp_path / "fib.gcc.omp-tasks"}
    assert lost["sort"] == {"omp-tasks@clang": tmp_path / "sort.clang.omp-tasks"}
    assert lost["nqueens"] == {} and lost["fft"] == {}
    assert registry.find_unexecutable(tmp_path, label="gcc")["sort"] == {}
    assert all(v == {} for v in registry.find_unexecutable(tmp_path / "missing").values())
