"""Reading a YAML file with one-line errors that name the file.

Board specs, campaign specs and the daemon config are all YAML a person edits; PyYAML's own
messages span five lines with the file name twice and snippets of the source, which a log line
or a CLI error cannot carry. Every reader goes through :func:`read_yaml`, so a missing file, a
file that is not UTF-8 and a syntax error read the same whichever file it was.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from platforms.errors import HidvfsError, SpecError


class YamlSyntaxError(SpecError):
    """The file is not YAML: one line naming the file, the line and column, and the problem."""

    def __init__(self, file: str, err: yaml.YAMLError):
        where, problem = yaml_problem(err)
        self.file, self.key, self.expected, self.got = file, "<file>", "valid YAML", None
        self.problem = problem
        HidvfsError.__init__(self, f"{file}: {where}not valid YAML: {problem}")


def yaml_problem(err: yaml.YAMLError) -> tuple[str, str]:
    """``("line L, column C: ", problem)`` from a PyYAML error, on one line. Lines and columns
    count from 1; the construct PyYAML was in, when it names one, follows with where it began:
    "expected ',' or ']', but got '<stream end>' (while parsing a flow sequence started at
    line 2, column 9)"."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if problem is not None:
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        context = getattr(err, "context", None)
        cmark = getattr(err, "context_mark", None)
        if context:
            started = (
                f" started at line {cmark.line + 1}, column {cmark.column + 1}"
                if cmark is not None
                else ""
            )
            problem = f"{problem} ({context}{started})"
        return where, " ".join(str(problem).split())
    if isinstance(err, yaml.reader.ReaderError):  # a character YAML does not allow
        first = str(err).splitlines()[0] if str(err) else "unreadable character"
        return f"character {err.position + 1}: ", " ".join(first.split())
    return "", " ".join(str(err).split())


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping: YAML leaves it undefined and
    PyYAML keeps the last one silently, so ``period_ms: 100`` then ``period_ms: 200`` in a
    config would run at 200 without a word."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} given twice (first at line {first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def read_yaml(
    path: str | os.PathLike[str],
    error: type[SpecError] = SpecError,
    syntax: type[YamlSyntaxError] = YamlSyntaxError,
) -> Any:
    """The parsed document of ``path``. An unreadable file raises ``error`` (key ``<file>``);
    a syntax error raises ``syntax``. A missing file raises ``FileNotFoundError`` for a caller
    with a default to fall back on; :func:`load_yaml` is for the rest."""
    file = os.fspath(path)
    try:
        with open(file, encoding="utf-8") as f:
            return yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except FileNotFoundError:
        raise
    except OSError as err:
        raise error(file, "<file>", f"a readable YAML file ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise error(
            file, "<file>", f"a UTF-8 text file ({err.reason} at byte {err.start})"
        ) from None
    except yaml.YAMLError as err:
        raise syntax(file, err) from None


def load_yaml(
    path: str | os.PathLike[str],
    error: type[SpecError] = SpecError,
    syntax: type[YamlSyntaxError] = YamlSyntaxError,
) -> Any:
    """:func:`read_yaml` where a missing file is an error like any other unreadable one."""
    try:
        return read_yaml(path, error, syntax)
    except FileNotFoundError as err:
        raise error(os.fspath(path), "<file>", f"a readable YAML file ({err.strerror})") from None
