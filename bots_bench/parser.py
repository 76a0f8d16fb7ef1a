"""Parse the result block BOTS prints at the end of a run (all four ``-o`` formats).

The block is anchored on its own ``Key = value`` lines (``-o 1``/``-o 3``) or on its
``;``-separated row (``-o 2``/``-o 4``, with or without the ``-z`` header), so kernel chatter
before or after it (concom's "Graph ... components" lines, uts's "completed!" without a
newline) is ignored. BOTS exits 0 even when verification fails: :func:`verification_ok` is
the check a runner must apply (bots.md sections 4.3, 5 and 8).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from bots_bench.registry import KERNELS, PROGRAMS, kernel_for_program

VERIFICATIONS = ("successful", "UNSUCCESSFUL", "n/a", "Not requested", "error")

# list-format keys in print order; each is left-justified to 20 columns then "= "
_LIST_KEYS = (
    "Program",
    "Parameters",
    "Model",
    "Embedded cut-off",
    "# of Threads",
    "Verification",
    "Time Program",
    "Time Sequential",
    "Speed-up",
    "Nodes",
    "Nodes/Sec",
    "Execution Date",
    "Execution Message",
    "Architecture",
    "Load Avg [1:5:15]",
    "Compilation Date",
    "Compilation Message",
    "Compiler",
    "Compiler Flags",
    "Linker",
    "Linker Flags",
)
_REQUIRED_LIST = ("Program", "# of Threads", "Verification", "Time Program")
_LIST_RE = re.compile(
    r"^(?P<key>" + "|".join(re.escape(k) for k in _LIST_KEYS) + r")[ \t]*= ?(?P<val>.*?)[ \t\r]*$",
    re.MULTILINE,
)
_ROW_HEADER = "Benchmark;Parameters;Model;Cutoff;Resources;Result;Time;Sequential;Speed-up;"
_ROW_FIELDS = (
    "Benchmark",
    "Parameters",
    "Model",
    "Cutoff",
    "Resources",
    "Result",
    "Time",
    "Sequential",
    "Speed-up",
    "Nodes",
    "Nodes/Sec",
)
# the fields of the detailed row after the abridged ones, counted from the end of the row
_ROW_TAIL = (
    "Architecture",
    "Processors",
    "Load Avg-1",
    "Load Avg-5",
    "Load Avg-15",
    "Comp Date",
    "Comp Time",
    "Comp Message",
    "CC",
    "CFLAGS",
    "LD",
    "LDFLAGS",
)
#: ASCII digits only: ``\d`` would take any Unicode digit (BOTS prints none)
_FLOAT_RE = re.compile(
    r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:inf|nan)$", re.I | re.ASCII
)


class BotsParseError(ValueError):
    """The output holds no complete BOTS result block; the message names what is missing."""


@dataclass(frozen=True)
class BotsResult:
    """One parsed result block. ``None`` means the binary did not print that value."""

    program: str
    parameters: str | None
    model: str | None
    cutoff: str | None
    threads: int
    verification: str
    time_program_s: float
    time_sequential_s: float | None = None
    speedup: float | None = None
    nodes: float | None = None
    nodes_per_s: float | None = None
    #: the ``-o`` format the block was printed in (1..4)
    output_format: int = 3
    #: the remaining fields (Execution Date, Architecture, Compiler, ...), by their BOTS name
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def kernel(self) -> str | None:
        """Registry name of the kernel that printed this block (None if unknown)."""
        return kernel_for_program(self.program)

    def to_dict(self) -> dict:
        return {
            "program": self.program,
            "kernel": self.kernel,
            "parameters": self.parameters,
            "model": self.model,
            "cutoff": self.cutoff,
            "threads": self.threads,
            "verification": self.verification,
            "time_program_s": self.time_program_s,
            "time_sequential_s": self.time_sequential_s,
            "speedup": self.speedup,
            "nodes": self.nodes,
            "nodes_per_s": self.nodes_per_s,
            "output_format": self.output_format,
            "extra": dict(self.extra),
        }


def _float(key: str, text: str, *, optional: bool = False) -> float | None:
    t = text.strip()
    if t.endswith("seconds"):
        t = t[: -len("seconds")].strip()
    if optional and t in ("n/a", ""):
        return None
    if not _FLOAT_RE.match(t):
        raise BotsParseError(f"BOTS output: {key!r} is not a number: {text!r}")
    return float(t)


def _digits(text: str) -> bool:
    """Only ASCII digits: ``str.isdigit`` also takes '²' or '①', which int() refuses."""
    return text.isascii() and text.isdigit()


def _int(key: str, text: str) -> int:
    t = text.strip()
    if not _digits(t):
        raise BotsParseError(f"BOTS output: {key!r} is not an integer: {text!r}")
    return int(t)


def _verification(text: str) -> str:
    t = text.strip()
    if t not in VERIFICATIONS:
        raise BotsParseError(
            f"BOTS output: unknown Verification value {t!r}; expected one of {', '.join(VERIFICATIONS)}"
        )
    return t


def _parse_list(text: str) -> BotsResult | None:
    matches = list(_LIST_RE.finditer(text))
    starts = [i for i, m in enumerate(matches) if m["key"] == "Program"]
    if not starts:
        return None  # stray "Key = value" chatter alone is not a block; try the row formats
    vals: dict[str, str] = {}
    for m in matches[starts[-1] :]:  # the last block wins; a repeated key ends it
        if m["key"] in vals:
            break
        vals[m["key"]] = m["val"]
    missing = [k for k in _REQUIRED_LIST if k not in vals]
    if missing:
        raise BotsParseError(
            f"BOTS result block for {vals['Program']!r} lacks: {', '.join(missing)}"
        )
    full = any(k in vals for k in _LIST_KEYS[_LIST_KEYS.index("Execution Date") :])
    verification = _verification(vals["Verification"])
    # the last block wins, but not over a failed check: an output that also holds an
    # UNSUCCESSFUL (or error) block is not a successful run (BOTS prints one block)
    failed = [
        m["val"].strip()
        for m in matches
        if m["key"] == "Verification" and m["val"].strip() in ("UNSUCCESSFUL", "error")
    ]
    if failed and verification not in ("UNSUCCESSFUL", "error"):
        verification = failed[-1]
    return BotsResult(
        program=vals["Program"],
        parameters=vals.get("Parameters"),
        model=vals.get("Model"),
        cutoff=vals.get("Embedded cut-off"),
        threads=_int("# of Threads", vals["# of Threads"]),
        verification=verification,
        time_program_s=_float("Time Program", vals["Time Program"]),
        time_sequential_s=_float("Time Sequential", vals.get("Time Sequential", ""), optional=True),
        speedup=_float("Speed-up", vals.get("Speed-up", ""), optional=True),
        nodes=_float("Nodes", vals.get("Nodes", ""), optional=True),
        nodes_per_s=_float("Nodes/Sec", vals.get("Nodes/Sec", ""), optional=True),
        output_format=1 if full else 3,
        extra={
            k: v for k, v in vals.items() if k in _LIST_KEYS[_LIST_KEYS.index("Execution Date") :]
        },
    )


def _row_candidate(fields: list[str]) -> bool:
    return (
        len(fields) >= 11
        and fields[5].strip() in VERIFICATIONS
        and bool(_FLOAT_RE.match(fields[6].strip()))
        and _digits(fields[4].strip())
    )


def _strip_chatter(benchmark: str) -> str:
    """A row glued to chatter without a newline: keep the known program name at its end."""
    if benchmark in PROGRAMS:
        return benchmark
    for name in sorted(PROGRAMS, key=len, reverse=True):
        if benchmark.endswith(name):
            return name
    return benchmark


def _parse_row(text: str) -> BotsResult | None:
    header = _ROW_HEADER in text
    rows: list[list[str]] = []
    for line in text.splitlines():
        if _ROW_HEADER in line:
            continue
        fields = line.rstrip("\r").split(";")
        if _row_candidate(fields):
            rows.append(fields)
    if not rows:
        if header:
            raise BotsParseError("BOTS output: a -z row header but no result row after it")
        return None
    f = [x.strip() for x in rows[-1]]
    if f and f[-1] == "":
        f = f[:-1]  # BOTS ends every row with ';'
    detailed = len(f) >= 11 + 3 + len(_ROW_TAIL)
    extra: dict[str, str] = {}
    if detailed:
        tail = f[-len(_ROW_TAIL) :]
        mid = f[11 : -len(_ROW_TAIL)]
        extra["Exec Date"] = mid[0]
        extra["Exec Time"] = mid[1]
        extra["Exec Message"] = ";".join(mid[2:])  # a message may itself hold ';'
        extra.update(zip(_ROW_TAIL, tail))
    nodes = _float("Nodes", f[9])
    return BotsResult(
        program=_strip_chatter(f[0]),
        parameters=f[1],
        model=f[2],
        cutoff=f[3],
        threads=_int("Resources", f[4]),
        verification=_verification(f[5]),
        time_program_s=_float("Time", f[6]),
        time_sequential_s=_float("Sequential", f[7], optional=True),
        speedup=_float("Speed-up", f[8], optional=True),
        # rows print 0.00 when the kernel counts no tasks; the list formats omit the line
        nodes=nodes if nodes else None,
        nodes_per_s=_float("Nodes/Sec", f[10]) if nodes else None,
        output_format=2 if detailed else 4,
        extra=extra,
    )


def parse_output(text: str) -> BotsResult:
    """Parse the (last) BOTS result block in ``text``, whatever its ``-o`` format.

    Raises :class:`BotsParseError` naming what is missing when there is no complete block
    (for example ``-o 0``, a crash before the end, or a truncated block).
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        result = _parse_list(text)
        if result is None:
            result = _parse_row(text)
    except BotsParseError:
        raise
    except ValueError as err:  # a value the checks let through: a parse error, not a crash
        raise BotsParseError(f"BOTS output: unreadable value ({err})") from None
    if result is None:
        keys = list(dict.fromkeys(m["key"] for m in _LIST_RE.finditer(text)))
        if keys:
            raise BotsParseError(
                f"BOTS output: found {', '.join(keys)} but no 'Program =' line starting a "
                "result block (truncated output?)"
            )
        snippet = text.strip()[-200:]
        raise BotsParseError(
            "BOTS output: no result block found (no 'Program = ...' / 'Time Program = ...' lines "
            f"and no ';'-separated result row); output ends with: {snippet!r}"
        )
    return result


def verification_error(result: BotsResult, check_requested: bool) -> str | None:
    """Why this run's verification is a failure, or None when it is acceptable."""
    v = result.verification
    if v == "successful":
        return None
    if v in ("n/a", "Not requested"):
        if check_requested:
            return f"Verification = {v} although -c was given"
        return None
    return f"Verification = {v}"


def run_error(result: BotsResult, kernel: str, check_requested: bool) -> str | None:
    """Why a run of ``kernel`` is a failure judged by its output, or None when it is acceptable.

    Beyond :func:`verification_error`: the block must come from the kernel that was launched
    (a wrong binary under the kernel's name would otherwise be measured as that kernel), and
    ``Time Program`` must be a finite, non-negative time (inf or a negative value means the
    binary's own timing broke, and would poison every mean and ratio downstream).
    """
    printed = result.kernel
    if printed != kernel:
        expected = (
            " or ".join(repr(p) for p in KERNELS[kernel].programs) if kernel in KERNELS else "?"
        )
        return (
            f"the binary printed Program = {result.program!r}"
            + (f" (kernel {printed})" if printed else " (no known kernel)")
            + f", not {expected} of {kernel}: wrong binary?"
        )
    t = result.time_program_s
    if not math.isfinite(t) or t < 0:
        return f"Time Program = {t!r} is not a finite, non-negative time"
    return verification_error(result, check_requested)


def verification_ok(result: BotsResult, check_requested: bool) -> bool:
    """``successful`` passes; ``n/a``/``Not requested`` pass only without ``-c``;
    ``UNSUCCESSFUL``/``error`` fail whatever the exit status was."""
    return verification_error(result, check_requested) is None
