"""BOTS output parser: the four -o formats, chatter, verification and malformed output."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bots_bench.parser import (
    VERIFICATIONS,
    BotsParseError,
    BotsResult,
    parse_output,
    verification_error,
    verification_ok,
)
from bots_bench.registry import PROGRAMS

# bots.md 5.1, -o 1, with the values filled in as BOTS prints them
SAMPLE_O1 = """
Program             = SparseLU (Single version)
Parameters          = S1=50x50, S2=100x100
Model               = OpenMP (using tasks)
Embedded cut-off    = none
# of Threads        = 4
Verification        = successful
Time Program        = 1.234567 seconds
Time Sequential     = 4.567890 seconds
Speed-up            = 3.70
Execution Date      = 2024/05/01;12:34
Execution Message   = run 7
Architecture        = Linux-aarch64;6
Load Avg [1:5:15]   = 0.51;0.33;0.20
Compilation Date    = 2024/04/30;09:00
Compilation Message =<SP>
Compiler            = gcc -fopenmp
Compiler Flags      = -c -I../..//common -O3   -I.
Linker              = gcc -fopenmp
Linker Flags        = -O3<SP><SP><SP>
""".replace("<SP>", " ")  # trailing blanks as BOTS prints them

# -o 3: the same lines up to Nodes/Sec (uts prints Nodes)
SAMPLE_O3 = """
Program             = Unbalance Tree Search
Parameters          = /opt/bots/inputs/uts/test.input
Model               = OpenMP (using tied tasks)
Embedded cut-off    = none
# of Threads        = 2
Verification        = Not requested
Time Program        = 0.812000 seconds
Nodes               = 4112897.00
Nodes/Sec           = 5065143.45
"""

HEADER_O2 = (
    "Benchmark;Parameters;Model;Cutoff;Resources;Result;Time;Sequential;Speed-up;Nodes;"
    "Nodes/Sec;Exec Date;Exec Time;Exec Message;Architecture;Processors;Load Avg-1;Load Avg-5;"
    "Load Avg-15;Comp Date;Comp Time;Comp Message;CC;CFLAGS;LD;LDFLAGS"
)
ROW_O2 = (
    "Fibonacci;N=40;OpenMP (using tasks);manual (10);6;successful;0.523400;n/a;n/a;0.00;0.00;"
    "2024/05/01;12:34;;Linux-aarch64;6;1.02;0.80;0.41;2024/04/30;09:00;;gcc -fopenmp;"
    "-c -I../..//common -O3   -I.;gcc -fopenmp;-O3   ;"
)
HEADER_O4 = (
    "Benchmark;Parameters;Model;Cutoff;Resources;Result;Time;Sequential;Speed-up;Nodes;Nodes/Sec;"
)
ROW_O4 = "Floorplan;/in/input.15;OpenMP (using tasks);none;3;UNSUCCESSFUL;2.000000;n/a;n/a;1234.00;617.00;"


def test_detailed_list():
    r = parse_output(SAMPLE_O1)
    assert r == BotsResult(
        program="SparseLU (Single version)",
        parameters="S1=50x50, S2=100x100",
        model="OpenMP (using tasks)",
        cutoff="none",
        threads=4,
        verification="successful",
        time_program_s=1.234567,
        time_sequential_s=4.56789,
        speedup=3.70,
        nodes=None,
        nodes_per_s=None,
        output_format=1,
    )
    assert r.kernel == "sparselu"
    assert r.extra["Architecture"] == "Linux-aarch64;6"
    assert r.extra["Compilation Message"] == ""
    assert r.extra["Compiler Flags"] == "-c -I../..//common -O3   -I."


def test_abridged_list_with_nodes():
    r = parse_output(SAMPLE_O3)
    assert r.output_format == 3 and r.kernel == "uts"
    assert r.model == "OpenMP (using tied tasks)"
    assert r.nodes == 4112897.0 and r.nodes_per_s == pytest.approx(5065143.45)
    assert r.time_sequential_s is None and r.speedup is None and r.extra == {}


@pytest.mark.parametrize("header", [True, False])
def test_detailed_row(header):
    text = (HEADER_O2 + "\n" if header else "") + ROW_O2 + "\n"
    r = parse_output(text)
    assert r.output_format == 2
    assert (r.program, r.parameters, r.cutoff, r.threads) == ("Fibonacci", "N=40", "manual (10)", 6)
    assert r.verification == "successful" and r.time_program_s == 0.5234
    assert r.time_sequential_s is None and r.speedup is None
    assert r.nodes is None and r.nodes_per_s is None  # rows print 0.00 for "no count"
    assert r.extra["Exec Date"] == "2024/05/01" and r.extra["Exec Time"] == "12:34"
    assert r.extra["Processors"] == "6" and r.extra["LDFLAGS"] == "-O3"
    assert r.extra["CFLAGS"] == "-c -I../..//common -O3   -I."


@pytest.mark.parametrize("header", [True, False])
def test_abridged_row(header):
    text = (HEADER_O4 + "\n" if header else "") + ROW_O4 + "\n"
    r = parse_output(text)
    assert r.output_format == 4 and r.kernel == "floorplan"
    assert r.verification == "UNSUCCESSFUL" and r.nodes == 1234 and r.nodes_per_s == 617
    assert not verification_ok(r, check_requested=False)


def test_message_with_semicolons_in_the_detailed_row():
    row = ROW_O2.replace("12:34;;Linux", "12:34;a;b;c;Linux")
    r = parse_output(row)
    assert r.extra["Exec Message"] == "a;b;c" and r.extra["Architecture"] == "Linux-aarch64"


def test_chatter_before_and_after():
    concom = (
        "Graph 0, Number of components 1\n"
        "Adding node 7 to component 3\n"
        * 50
        + SAMPLE_O3.replace("Unbalance Tree Search", "Connected Components")
        + "Graph 1, Number of components 12\n"
    )
    r = parse_output(concom)
    assert r.kernel == "concom" and r.nodes == 4112897.0
    # uts prints "completed!" without a newline: the row is glued to it
    glued = "Tree size = 4112897\nWallclock time = 0.8 sec\ncompleted!" + ROW_O4.replace(
        "Floorplan", "Unbalance Tree Search"
    )
    r = parse_output(glued)
    assert r.program == "Unbalance Tree Search" and r.kernel == "uts"
    glued_header = "completed!" + HEADER_O4 + "\n" + ROW_O4
    assert parse_output(glued_header).program == "Floorplan"
    # the list format after a glued line is unaffected: the block starts with a newline
    assert parse_output("completed!" + SAMPLE_O3).time_program_s == 0.812


def test_key_like_chatter_before_a_row():
    chatter = "Model = binomial tree\nNodes = about a million\n"
    r = parse_output(chatter + HEADER_O4 + "\n" + ROW_O4 + "\n")
    assert r.program == "Floorplan" and r.model == "OpenMP (using tasks)"


def test_last_block_wins():
    first = SAMPLE_O3.replace("0.812000", "9.000000")
    assert parse_output(first + "\nrunning again\n" + SAMPLE_O3).time_program_s == 0.812


def test_a_failed_block_is_not_hidden_by_a_later_successful_one():
    """BOTS prints one block; an output with an UNSUCCESSFUL one and then a successful one
    (a wrapper that ran twice, a doctored binary) is not a verified run."""
    bad = SAMPLE_O3.replace("Not requested", "UNSUCCESSFUL")
    good = SAMPLE_O3.replace("Not requested", "successful")
    r = parse_output(bad + "\nrunning again\n" + good)
    assert r.verification == "UNSUCCESSFUL" and r.time_program_s == 0.812
    assert parse_output(good + "\n" + good).verification == "successful"


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("", "no result block found"),
        ("Error: Unrecognized parameter.\nUsage: ...\n", "no result block found"),
        (SAMPLE_O3.split("Time Program")[0], "lacks: Time Program"),
        (SAMPLE_O3.replace("# of Threads        = 2\n", ""), "lacks: # of Threads"),
        (SAMPLE_O3.replace("0.812000", "fast"), "'Time Program' is not a number: 'fast seconds'"),
        (SAMPLE_O3.replace("Not requested", "maybe"), "unknown Verification value 'maybe'"),
        (SAMPLE_O3.split("Program             = Unbalance Tree Search\n")[1], "no 'Program ='"),
        (HEADER_O4 + "\n", "a -z row header but no result row"),
    ],
)
def test_malformed_output(text, msg):
    with pytest.raises(BotsParseError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        parse_output(text)


@pytest.mark.parametrize(
    ("verification", "check", "ok"),
    [
        ("successful", True, True),
        ("successful", False, True),
        ("n/a", False, True),
        ("Not requested", False, True),
        ("n/a", True, False),
        ("Not requested", True, False),
        ("UNSUCCESSFUL", False, False),
        ("UNSUCCESSFUL", True, False),
        ("error", True, False),
        ("error", False, False),
    ],
)
def test_verification_rules(verification, check, ok):
    r = parse_output(SAMPLE_O3.replace("Not requested", verification))
    assert verification_ok(r, check) is ok
    assert (verification_error(r, check) is None) is ok
    if not ok:
        assert verification in verification_error(r, check)


# -- real output of the test kernels ---------------------------------------------------------
def _run(bots_tree, name, *args, env=None):
    import os

    e = dict(os.environ, OMP_NUM_THREADS="2", **(env or {}))
    p = subprocess.run(
        [str(bots_tree.binary(name)), *args], capture_output=True, text=True, env=e, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize("fmt", ["1", "2", "3", "4"])
@pytest.mark.parametrize("header", [False, True])
@pytest.mark.parametrize("verbose", ["0", "1"])
def test_all_formats_from_real_output(bots_tree, fmt, header, verbose):
    args = ["-n", "8", "-m", "16", "-c", "-v", verbose, "-o", fmt, "-e", "hidvfs"]
    out = _run(bots_tree, "sparselu.gcc.single-omp-tasks", *args, *(["-z"] if header else []))
    r = parse_output(out)
    assert r.output_format == int(fmt)
    assert r.program == "SparseLU (Single version)" and r.parameters == "S1=8x8, S2=16x16"
    assert r.threads == 2 and r.verification == "successful"
    assert r.time_sequential_s is not None and r.time_sequential_s > 0
    assert r.speedup == pytest.approx(r.time_sequential_s / r.time_program_s, abs=0.006)
    if fmt == "1":
        assert r.extra["Execution Message"] == "hidvfs"
        assert r.extra["Compilation Date"] == "2024/05/01;12:00"
    if fmt == "2":
        assert r.extra["Exec Message"] == "hidvfs" and r.extra["Comp Time"] == "12:00"


@pytest.mark.parametrize("fmt", ["2", "3", "4"])
def test_real_chatter_of_uts_and_concom(bots_tree, fmt):
    out = _run(
        bots_tree,
        "uts.gcc.omp-tasks",
        "-f",
        str(bots_tree.inputs / "uts/test.input"),
        "-c",
        "-v",
        "1",
        "-o",
        fmt,
    )
    assert "completed!" in out
    r = parse_output(out)
    assert r.kernel == "uts" and r.nodes == bots_tree.uts_test_nodes
    assert r.verification == "successful"
    out = _run(bots_tree, "concom.gcc.omp-tasks", "-n", "500", "-c", "-v", "0", "-o", fmt)
    assert "Number of components" in out
    assert parse_output(out).kernel == "concom"


def test_unsuccessful_with_exit_zero(bots_tree):
    out = _run(
        bots_tree,
        "fib.gcc.omp-tasks",
        "-n",
        "15",
        "-c",
        "-v",
        "0",
        "-o",
        "3",
        env={"BOTS_TEST_FAULT": "bad"},
    )
    r = parse_output(out)
    assert r.verification == "UNSUCCESSFUL"
    assert verification_error(r, True) == "Verification = UNSUCCESSFUL"


def test_format_zero_prints_nothing_to_parse(bots_tree):
    out = _run(bots_tree, "fib.gcc.omp-tasks", "-n", "10", "-v", "0", "-o", "0")
    with pytest.raises(BotsParseError, match="no result block"):
        parse_output(out)


# -- round trip through a renderer written from bots.md section 5 ------------------------------
def _render(r: BotsResult, fmt: int, header: bool) -> str:
    tp = f"{r.time_program_s:f}"
    ts = "n/a" if r.time_sequential_s is None else f"{r.time_sequential_s:f}"
    sp = "n/a" if r.speedup is None else f"{r.speedup:3.2f}"
    nd = f"{r.nodes or 0:3.2f}"
    nps = f"{(r.nodes or 0) / r.time_program_s:3.2f}"
    if fmt in (1, 3):
        lines = [
            "",
            *[
                f"{k:<20}= {v}"
                for k, v in [
                    ("Program", r.program),
                    ("Parameters", r.parameters),
                    ("Model", r.model),
                    ("Embedded cut-off", r.cutoff),
                    ("# of Threads", r.threads),
                    ("Verification", r.verification),
                    ("Time Program", tp + " seconds"),
                ]
            ],
        ]
        if r.time_sequential_s is not None:
            lines += [f"{'Time Sequential':<20}= {ts} seconds", f"{'Speed-up':<20}= {sp}"]
        if r.nodes:
            lines += [f"{'Nodes':<20}= {nd}", f"{'Nodes/Sec':<20}= {nps}"]
        if fmt == 1:
            lines += [f"{'Execution Date':<20}= 2024/01/01;00:00", f"{'Linker Flags':<20}= -O3"]
        return "\n".join(lines) + "\n"
    row = f"{r.program};{r.parameters};{r.model};{r.cutoff};{r.threads};{r.verification};{tp};{ts};{sp};{nd};{nps};"
    if fmt == 2:
        row += "2024/01/01;00:00;msg;Linux-x86_64;2;0.1;0.2;0.3;2024/01/01;00:00;;gcc;-O2;gcc;-O2;"
    head = (HEADER_O2 if fmt == 2 else HEADER_O4) + "\n" if header else ""
    return head + row + "\n"


chatter = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters="=;\r\n", blacklist_categories=("Cs",)),
        max_size=40,
    ),
    max_size=4,
).map(lambda xs: "".join(x + "\n" for x in xs))


@settings(max_examples=150, deadline=None)
@given(
    program=st.sampled_from(sorted(PROGRAMS)),
    threads=st.integers(1, 256),
    verification=st.sampled_from(VERIFICATIONS),
    tp=st.floats(1e-6, 1e5),
    seq=st.one_of(st.none(), st.floats(1e-6, 1e5)),
    nodes=st.one_of(st.none(), st.integers(1, 10**12)),
    fmt=st.sampled_from([1, 2, 3, 4]),
    header=st.booleans(),
    before=chatter,
    after=chatter,
)
def test_round_trip(program, threads, verification, tp, seq, nodes, fmt, header, before, after):
    tp = float(f"{tp:f}")
    assume(tp > 0)
    src = BotsResult(
        program=program,
        parameters="N=1",
        model="OpenMP (using tasks)",
        cutoff="none",
        threads=threads,
        verification=verification,
        time_program_s=tp,
        time_sequential_s=None if seq is None else float(f"{seq:f}"),
        speedup=None if seq is None else float(f"{float(f'{seq:f}') / tp:3.2f}"),
        nodes=None if nodes is None else float(nodes),
        nodes_per_s=None,
    )
    r = parse_output(before + _render(src, fmt, header) + after)
    assert r.output_format == fmt
    assert (r.program, r.threads, r.verification) == (program, threads, verification)
    assert r.time_program_s == float(f"{tp:f}")
    assert r.time_sequential_s == src.time_sequential_s and r.speedup == src.speedup
    assert r.nodes == src.nodes
    if nodes:
        assert r.nodes_per_s == pytest.approx(nodes / tp, rel=1e-2, abs=0.01)


# -- a value that str.isdigit() takes but int() refuses used to lose the whole run ------
@pytest.mark.parametrize(
    "value", ["\u00b2", "\u2460", "\u0664", "\uff14"]
)  # ², ①, Arabic 4, fullwidth 4
def test_non_ascii_digits_are_a_parse_error_not_a_crash(value):
    block = SAMPLE_O1.replace("# of Threads        = 4", f"# of Threads        = {value}")
    assert value in block
    with pytest.raises(BotsParseError, match="not an integer"):
        parse_output(block)
    row = f"SparseLU;S1=50x50;OpenMP;none;{value};successful;1.234567;n/a;n/a;0.00;0.00;"
    with pytest.raises(BotsParseError):
        parse_output(row)


def test_non_ascii_digits_in_a_time_are_a_parse_error():
    block = SAMPLE_O1.replace("1.234567 seconds", "\u0661.\u0665 seconds")  # Arabic 1.5
    with pytest.raises(BotsParseError, match="not a number"):
        parse_output(block)
