"""SQLite results store of a campaign: one row per run record, resumable, crash-safe.

A row is the DESIGN.md run record (``bench``, ``class``, ``policy``, ``seed``, ``board``,
``backend``, ``makespan_s``, ``energy_j`` ... ``ok``, ``error``) plus the repetition, the
BOTS ``Time Program``, the CPU-rail energy, EDP, timestamps, the full run configuration
(JSON), the binary's stdout and the time series for plots. The sim and the native campaign
write the same rows, so one report reads both.

Each run is committed on its own in WAL mode: Ctrl-C or a crash loses at most the run in
flight, and :meth:`Store.done_keys` lets a re-run skip what is finished. Several campaigns may
write one file at once (each commit takes SQLite's write lock), and several may create a new
file at once: the schema is checked and made inside one ``BEGIN IMMEDIATE`` transaction, so
it is made once. The schema version is ``PRAGMA user_version``; a file from a newer hidvfs is
refused rather than misread.

Campaigns sharing a file share the work: a run is claimed (table ``claims``: run key, owner
``host:pid:start``, heartbeat) before it runs, and a run another live campaign holds is left
to it, then waited for at the end (:func:`~bots_bench.campaign_run.run_pending`). The claim
goes when the result is stored (in the same transaction) or the run fails to store or is
interrupted; a claim whose owner died, or whose heartbeat is older than
:data:`~bots_bench.claims.CLAIM_STALE_S`, is taken over.

Time series JSON (``timeseries``): ``{"t": [s, ...], "freq_khz": {cluster: [...]},
"temp_c": {zone: [...]}, "power_w": {rail: [...]}}``; every list as long as ``t``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from bots_bench import claims
from bots_bench.claims import Claim, Owner, _Heartbeat, decide_claim, owner_alive
from platforms.errors import HidvfsError

DEFAULT_DB = "results.sqlite"
SCHEMA_VERSION = 1
#: how long an open or a commit waits for another campaign's write lock on the same file
_BUSY_TIMEOUT_S = 30.0
#: how long a wait for that lock goes on before it is said on stderr (SQLite waits silently)
_BUSY_NOTICE_S = 1.0
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_CANTOPEN = 5, 6, 8, 14
_T = TypeVar("_T")


class StoreError(HidvfsError):
    """The results file cannot be used (newer schema, not a store) or a record is malformed."""


class RunKey(NamedTuple):
    """What identifies a run across sessions: a re-run skips a key that is already stored."""

    bench: str
    cls: str
    policy: str
    seed: int
    board: str
    backend: str
    rep: int
    spec_hash: str

    def label(self) -> str:
        return f"{self.bench}/{self.cls} {self.policy} seed {self.seed} rep {self.rep}"


# (record key, SQL type); the order is the column order of exports
_KEY_COLUMNS = (
    ("bench", "TEXT NOT NULL"),
    ("class", "TEXT NOT NULL"),
    ("policy", "TEXT NOT NULL"),
    ("seed", "INTEGER NOT NULL"),
    ("board", "TEXT NOT NULL"),
    ("backend", "TEXT NOT NULL"),
    ("rep", "INTEGER NOT NULL"),
    ("spec_hash", "TEXT NOT NULL"),
)
_METRIC_COLUMNS = (
    ("criticality", "TEXT"),
    ("makespan_s", "REAL"),
    ("time_program_s", "REAL"),
    ("energy_j", "REAL"),
    ("cpu_energy_j", "REAL"),
    ("edp", "REAL"),
    ("peak_temp_c", "REAL"),
    ("deadline_s", "REAL"),
    ("deadline_met", "INTEGER"),
    ("lower_bound_s", "REAL"),
    ("graham_bound_s", "REAL"),
    ("ok", "INTEGER NOT NULL"),
    ("error", "TEXT"),
    ("started", "TEXT"),
    ("ended", "TEXT"),
)
_BLOB_COLUMNS = (("config", "TEXT"), ("stdout", "TEXT"), ("timeseries", "TEXT"), ("extra", "TEXT"))
COLUMNS: tuple[str, ...] = tuple(c for c, _ in _KEY_COLUMNS + _METRIC_COLUMNS + _BLOB_COLUMNS)
_FLOATS = {c for c, t in _METRIC_COLUMNS if t == "REAL"}
_BOOLS = {"ok", "deadline_met"}
_TEXTS = {"criticality", "error", "started", "ended"}
#: nullable columns every results file has had: one missing was renamed or dropped, not
#: "from an older hidvfs" (read as empty, a report said makespan n/a and 0 failed runs, and
#: a campaign re-added it and counted its runs failed)
_CORE = frozenset({"makespan_s", "energy_j", "deadline_s", "deadline_met", "error"})
#: columns a :meth:`Store.runs` filter may name
FILTERABLE = frozenset(c for c, _ in _KEY_COLUMNS + _METRIC_COLUMNS) | {"id"}

_SCHEMA = f"""
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_key TEXT NOT NULL UNIQUE,
    {", ".join(f'"{c}" {t}' for c, t in _KEY_COLUMNS + _METRIC_COLUMNS + _BLOB_COLUMNS)}
);
CREATE INDEX runs_group ON runs (bench, "class", policy, seed);
"""
#: runs a campaign is doing now; no schema version of its own: an older hidvfs reads and
#: writes the runs as before and leaves this table alone (its campaigns claim nothing)
_CLAIMS_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    run_key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    heartbeat REAL NOT NULL
)
"""
_CLAIM_COLUMNS = frozenset({"run_key", "owner", "heartbeat"})
_TAKE_CLAIM = (
    "INSERT INTO claims (run_key, owner, heartbeat) VALUES (?, ?, ?) "
    "ON CONFLICT(run_key) DO UPDATE SET owner = excluded.owner, heartbeat = excluded.heartbeat"
)


def _statements(script: str) -> list[str]:
    """The statements of an SQL script, one by one (``executescript`` would commit the
    transaction they must run in)."""
    out, stmt = [], ""
    for part in script.split(";"):
        stmt += part + ";"
        if sqlite3.complete_statement(stmt):
            if stmt.strip().strip(";").strip():
                out.append(stmt.strip())
            stmt = ""
    if stmt.strip().strip(";").strip():  # an unfinished tail: let SQLite say what is wrong
        out.append(stmt.strip())
    return out


def _locked(path: Path, err: sqlite3.Error) -> str:
    return (
        f"{path}: locked by another process for longer than {_BUSY_TIMEOUT_S:g} s ({err}: a "
        "campaign or a tool writing it?); try again when it is done, or use a copy"
    )


def _waiting_notice(path: Path) -> str:
    return (
        f"waiting up to {_BUSY_TIMEOUT_S:g} s for the lock on {path}, held by another process "
        "(a concurrent `hidvfs bots run` on the same --db?)"
    )


def _set_busy_timeout(db: sqlite3.Connection, seconds: float) -> None:
    """How long SQLite itself waits for a lock before it fails with "database is locked"."""
    db.execute(f"PRAGMA busy_timeout = {max(int(seconds * 1000), 0)}")


def _wait_for_lock(db: sqlite3.Connection, path: Path, attempt: Callable[[], _T]) -> _T:
    """``attempt()``, waiting while another process holds the file's lock, for
    ``_BUSY_TIMEOUT_S`` in all, and saying so on stderr, once, when the wait has lasted
    ``_BUSY_NOTICE_S``: SQLite waits in silence and the user saw a hang. SQLite is first given
    the time up to the notice, then what is left of the budget; a lock error after the budget
    is raised. ``attempt`` must be safe to run again after it failed on the lock: one statement,
    or a transaction it rolls back."""
    start = time.monotonic()
    deadline = start + _BUSY_TIMEOUT_S
    notice_at = min(start + _BUSY_NOTICE_S, deadline)
    said = False
    try:
        while True:
            _set_busy_timeout(db, (deadline if said else notice_at) - time.monotonic())
            try:
                return attempt()
            except sqlite3.OperationalError as err:
                if _error_code(err) not in (_SQLITE_BUSY, _SQLITE_LOCKED):
                    raise
                now = time.monotonic()
                if now >= deadline:
                    raise
                if not said and now >= notice_at:
                    print(_waiting_notice(path), file=sys.stderr, flush=True)
                    said = True
                # some locks SQLite does not wait for (turning a file to WAL): try again soon
                time.sleep(min(0.01, deadline - now))
    finally:
        _set_busy_timeout(db, _BUSY_TIMEOUT_S)


def _error_code(err: sqlite3.Error) -> int | None:
    """SQLite's primary result code of an error (from its message before Python 3.11)."""
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    msg = str(err)
    for words, c in (
        (("database is locked", "database is busy"), _SQLITE_BUSY),
        (("table is locked", "database table is locked"), _SQLITE_LOCKED),
        (("readonly database",), _SQLITE_READONLY),
        (("unable to open",), _SQLITE_CANTOPEN),
    ):
        if any(w in msg for w in words):
            return c
    return None


def _has_content(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def run_key(record: Mapping[str, Any]) -> RunKey:
    """The :class:`RunKey` of a run record (``rep`` defaults to 0, ``spec_hash`` to '')."""
    missing = [
        k for k in ("bench", "class", "policy", "seed", "board", "backend") if k not in record
    ]
    if missing:
        raise StoreError(f"run record lacks key field(s): {', '.join(missing)}")
    for k in ("bench", "class", "policy", "board", "backend"):
        if not isinstance(record[k], str) or not record[k]:
            raise StoreError(
                f"run record field {k!r} must be a non-empty string, got {record[k]!r}"
            )
    for k in ("seed", "rep"):
        v = record.get(k, 0)
        if not isinstance(v, int) or isinstance(v, bool):
            raise StoreError(f"run record field {k!r} must be an integer, got {v!r}")
    spec_hash = record.get("spec_hash", "") or ""
    if not isinstance(spec_hash, str):
        raise StoreError(f"run record field 'spec_hash' must be a string, got {spec_hash!r}")
    return RunKey(
        record["bench"],
        record["class"],
        record["policy"],
        int(record["seed"]),
        record["board"],
        record["backend"],
        int(record.get("rep", 0)),
        spec_hash,
    )


#: the name given to a series that is one number per sample rather than one per cluster/zone
_SCALAR_NAMES = {"freq_khz": "cpu", "temp_c": "max", "power_w": "total"}


def normalize_timeseries(ts: Any) -> dict[str, Any]:
    """Column form ``{"t": [...], group: {name: [...]}}`` of a time series.

    Accepts that form, or a list of samples ``[{"t": s, "freq_khz": {cluster: khz},
    "temp_c": c, ...}, ...]`` (what the simulated runs record); a group whose samples are
    plain numbers becomes one series named after the group (``temp_c`` -> ``max``).
    """
    if isinstance(ts, Mapping):
        if "t" not in ts or not isinstance(ts["t"], list):
            raise StoreError("time series must have a list 't' of sample times")
        out: dict[str, Any] = {"t": list(ts["t"])}
        for group, v in ts.items():
            if group == "t":
                continue
            if isinstance(v, list):
                v = {_SCALAR_NAMES.get(group, "value"): v}
            if not isinstance(v, Mapping):
                raise StoreError(f"time series group {group!r} must map names to lists, got {v!r}")
            for name, series in v.items():
                if not isinstance(series, list) or len(series) != len(out["t"]):
                    raise StoreError(
                        f"time series {group}.{name} must be a list as long as 't' ({len(out['t'])})"
                    )
            out[group] = {str(k): list(s) for k, s in v.items()}
        return out
    if isinstance(ts, list):
        times: list[Any] = []
        groups: dict[str, dict[str, list]] = {}
        for i, sample in enumerate(ts):
            if not isinstance(sample, Mapping) or "t" not in sample:
                raise StoreError(
                    f"time series sample {i} must be a mapping with 't', got {sample!r}"
                )
            for group, v in sample.items():
                if group == "t":
                    continue
                named = v if isinstance(v, Mapping) else {_SCALAR_NAMES.get(group, "value"): v}
                g = groups.setdefault(group, {})
                for name, x in named.items():
                    g.setdefault(str(name), [None] * i).append(x)
            times.append(sample["t"])
            for g in groups.values():  # a value missing from this sample is None
                for col in g.values():
                    col.extend([None] * (len(times) - len(col)))
        return {"t": times, **groups}
    raise StoreError(
        f"time series must be a mapping of lists or a list of samples, got {type(ts).__name__}"
    )


def _q(column: str) -> str:
    """Quote a column name (``class`` is an SQL keyword); names come from COLUMNS only."""
    return f'"{column}"'


def _key_text(key: RunKey) -> str:
    return json.dumps(list(key), separators=(",", ":"))


def _num(key: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise StoreError(f"run record field {key!r} must be a number or null, got {v!r}")
    v = float(v)
    if math.isnan(v):
        return None  # sqlite stores NaN as NULL anyway; say so explicitly
    return v


def _dumps(key: str, v: Any) -> str:
    try:
        return json.dumps(v, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise StoreError(f"run record field {key!r} is not JSON-serialisable: {err}") from None


def _row_values(record: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    key = run_key(record)
    if "ok" not in record:
        raise StoreError(f"run record {key.label()} lacks 'ok'")
    vals: dict[str, Any] = dict(zip([c for c, _ in _KEY_COLUMNS], key))
    for c in _FLOATS:
        vals[c] = _num(c, record.get(c))
    for c in _BOOLS:
        v = record.get(c)
        if v is not None and not isinstance(v, (bool, int)):
            raise StoreError(f"run record field {c!r} must be true/false or null, got {v!r}")
        vals[c] = None if v is None else int(bool(v))
    for c in _TEXTS:
        v = record.get(c)
        vals[c] = None if v is None else str(v)
    if vals["edp"] is None and vals["energy_j"] is not None and vals["makespan_s"] is not None:
        vals["edp"] = vals["energy_j"] * vals["makespan_s"]
    stdout = record.get("stdout")
    vals["stdout"] = None if stdout is None else str(stdout)
    vals["config"] = _dumps("config", dict(record.get("config") or {}))
    ts = record.get("timeseries")
    if ts is None and record.get("series") is not None:
        ts = record["series"]
    ts = None if ts is None else normalize_timeseries(ts)
    vals["timeseries"] = None if ts is None else _dumps("timeseries", ts)
    skip = {"id", "run_key", "series"}
    extra = {k: v for k, v in record.items() if k not in COLUMNS and k not in skip}
    vals["extra"] = _dumps("extra", extra)
    return _key_text(key), vals


_INTS = {c for c, t in _KEY_COLUMNS + _METRIC_COLUMNS if t.startswith("INTEGER")}


class _BadRow(Exception):
    """A value of a stored row that no writer of this file makes (an edit, a damaged file)."""


def _json_object(column: str, text: Any, allow_null: bool = False) -> Any:
    """The JSON object stored in ``column`` (what the writer stored: a mapping)."""
    if text is None and allow_null:
        return None
    try:
        v = json.loads(text or "{}")
    except (TypeError, ValueError) as err:
        raise _BadRow(f"column {column}: not JSON ({err})") from None
    if not isinstance(v, dict):
        raise _BadRow(f"column {column}: a JSON {type(v).__name__}, not an object")
    return v


def _row_to_record(row: sqlite3.Row, with_stdout: bool, with_timeseries: bool) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": row["id"]}
    have = set(row.keys())  # a read-only older file may lack the newer nullable columns
    for c in COLUMNS:
        if c in ("config", "stdout", "timeseries", "extra"):
            continue
        v = row[c] if c in have else None
        if v is not None and (
            (c in _FLOATS and not isinstance(v, (int, float)))
            or (c in _INTS and not isinstance(v, int))
        ):
            raise _BadRow(f"column {c}: {v!r:.40} is not a number")
        rec[c] = None if v is None else (bool(v) if c in _BOOLS else v)
    blob = {c: (row[c] if c in have else None) for c, _ in _BLOB_COLUMNS}
    rec["config"] = _json_object("config", blob["config"])
    if with_stdout:
        rec["stdout"] = blob["stdout"]
    if with_timeseries:
        rec["timeseries"] = _json_object("timeseries", blob["timeseries"], allow_null=True)
    for k, v in _json_object("extra", blob["extra"]).items():
        rec.setdefault(k, v)
    return rec


class Store:
    """A results file. Use as a context manager, or call :meth:`close`.

    ``readonly`` opens an existing file for reading only (reports): nothing is migrated or
    written, so a file given by mistake is left exactly as it was, and nothing is left beside
    it. A WAL-mode file needs SQLite's ``-shm``/``-wal`` files beside it even to be read:

    * in a folder the reader may write (and with no run left in a ``-wal``), the file is
      opened with ``query_only`` rather than ``mode=ro``, so SQLite removes the ``-shm`` and
      ``-wal`` it made when the report closes it (a read-only connection cannot); should a
      campaign write the file and close it meanwhile, the report, last to close it, merges
      that campaign's ``-wal`` into the file as the campaign would have;
    * otherwise it is opened ``mode=ro``, which shares the files a running campaign keeps;
    * when that cannot work either (a root-owned folder, as ``sudo hidvfs bots run`` leaves
      it, read by a user, the campaign over), the file is read ``immutable``: as it is on
      disk, without SQLite's locks. That is safe because every finished run is in the file
      then (a campaign merges its ``-wal`` when it closes); should a ``-wal`` or rollback
      journal beside the file still hold data (a campaign writing it, or one killed before
      it closed the file), the file is refused with a message rather than read without it.
      A campaign started on the file while such a report reads it is not seen, and its
      writes may make the report fail or read a mix of old and new pages: run it again.
    """

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_DB, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        #: the read-only file is read as it is on disk, without SQLite's locks (see above)
        self.immutable = False
        db = None
        try:
            if readonly:
                db = self._connect_readonly()
            else:
                db = sqlite3.connect(str(self.path), timeout=_BUSY_TIMEOUT_S)
            db.row_factory = sqlite3.Row
            self._db = db
            self._open_schema()
        except sqlite3.DatabaseError as err:
            if db is not None:
                db.close()
            raise StoreError(self._open_problem(err)) from None
        except BaseException:
            if db is not None:
                db.close()
            raise

    def _connect_readonly(self) -> sqlite3.Connection:
        """A connection that can read the file and cannot write it (see the class doc)."""
        path = self.path.resolve()
        uri = path.as_uri()
        pending = [j for j in (f"{path}-wal", f"{path}-journal") if _has_content(j)]
        modes = ["mode=ro"]
        if (
            not pending
            and path.is_file()
            and os.access(path, os.R_OK | os.W_OK)
            and os.access(path.parent, os.W_OK | os.X_OK)
        ):
            modes.insert(0, "mode=rw")
        for mode in modes:
            db = None
            try:
                db = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=_BUSY_TIMEOUT_S)
                db.execute("PRAGMA query_only = 1")
                sql = "SELECT count(*) FROM sqlite_master"  # opens -shm/-wal
                _wait_for_lock(db, self.path, lambda c=db, q=sql: c.execute(q).fetchone())
                return db
            except sqlite3.DatabaseError as err:
                if db is not None:
                    db.close()
                if _error_code(err) not in (_SQLITE_READONLY, _SQLITE_CANTOPEN):
                    raise
                if not path.is_file() or not os.access(path, os.R_OK):
                    raise
        # SQLite cannot make the -shm a WAL-mode file needs: read the file as it is on disk
        pending = [j for j in (f"{path}-wal", f"{path}-journal") if _has_content(j)]
        if pending:
            raise StoreError(
                f"{self.path}: {Path(pending[0]).name} beside it still holds data SQLite must "
                "merge into the file before it can be read (a campaign is writing the file, or "
                f"one was stopped before it closed it), and {path.parent} is not writable for "
                "you; read it once the campaign is over, as the user who ran it (e.g. with "
                "sudo), or copy the file and its -wal to a folder you can write"
            )
        db = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except BaseException:
            db.close()
            raise
        self.immutable = True
        return db

    def _open_problem(self, err: sqlite3.DatabaseError) -> str:
        """Why the file did not open: a missing or unwritable folder is said as such (SQLite
        only says "unable to open database file"), anything else is not a usable store."""
        folder = self.path.absolute().parent
        if not folder.is_dir():
            if folder.exists():
                return f"{self.path}: {folder} is a file, not a folder; choose another --db"
            return (
                f"{self.path}: its folder {folder} does not exist; create it or choose another --db"
            )
        if not self.readonly and not os.access(folder, os.W_OK | os.X_OK):
            return self._folder_not_writable(folder)
        if self.readonly and self.path.is_file() and not os.access(self.path, os.R_OK):
            return f"{self.path}: you may not read this file ({err})"
        if _error_code(err) in (_SQLITE_BUSY, _SQLITE_LOCKED):  # the file is fine
            return _locked(self.path, err)
        return f"{self.path}: not a usable SQLite results store ({err})"

    def _folder_not_writable(self, folder: Path) -> str:
        return (
            f"{self.path}: its folder {folder} is not writable (SQLite keeps its journal "
            "beside the file); choose a --db in a folder you can write"
        )

    def _cannot_store(self, err: sqlite3.Error) -> str:
        folder = self.path.absolute().parent
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            return self._folder_not_writable(folder)
        if _error_code(err) in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return _locked(self.path, err)
        return f"{self.path}: cannot store runs in this file ({err})"

    # -- schema -------------------------------------------------------------------------
    def _schema_state(self) -> tuple[int, set[str]]:
        """The schema version and the table names, read in one transaction."""
        db = self._db
        begun = not db.in_transaction
        if begun:
            db.execute("BEGIN")  # one snapshot: a creator commits both at once
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            if begun:
                db.rollback()
        return version, tables

    def _check_schema(self, version: int, tables: set[str]) -> None:
        """Refuse a file from a newer hidvfs, or one that is not a results store."""
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: written by a newer hidvfs (results schema {version}; this version "
                f"reads up to {SCHEMA_VERSION}); upgrade hidvfs or choose another --db"
            )
        if version == 0 and tables - {"sqlite_sequence"}:
            raise StoreError(
                f"{self.path}: an SQLite file that is not a hidvfs results store "
                f"(tables {sorted(tables)}, no schema version)"
            )
        if version != 0 and "runs" not in tables:
            raise StoreError(f"{self.path}: results schema {version} but no 'runs' table")

    def _open_schema(self) -> None:
        db = self._db
        if self.readonly:
            _wait_for_lock(
                db,
                self.path,
                lambda: self._check_readable(db.execute("PRAGMA user_version").fetchone()[0]),
            )
            return
        # The schema is read, checked, made or extended in one write transaction: campaigns
        # started together on a new file used to see it empty, and all but one then failed
        # ("table runs already exists", or tables without a version read as "not a store").
        # Tables and version land together: a kill in between cannot leave a file with tables
        # and no version, which every later run would refuse as "not a store".
        try:
            _wait_for_lock(db, self.path, lambda: db.execute("BEGIN IMMEDIATE"))
        except sqlite3.OperationalError as err:
            self._check_schema(*self._schema_state())  # a newer or foreign file says so first
            raise StoreError(self._cannot_store(err)) from None
        try:
            version, tables = self._schema_state()
            self._check_schema(version, tables)
            if version == 0:
                for stmt in _statements(_SCHEMA):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._add_missing_columns()
            self._add_claims_table()
            _wait_for_lock(db, self.path, db.commit)  # a new file's readers (rollback journal)
        except BaseException:
            if db.in_transaction:
                db.rollback()
            raise
        self._use_wal()
        db.execute("PRAGMA synchronous=FULL")
        self._check_writable()

    def _use_wal(self) -> None:
        """Put the file in WAL mode (it stays so). Turning a file to WAL needs it alone for a
        moment and SQLite does not wait for that, so while another campaign that opens the
        same new file holds it, try again, for as long as a lock is waited for."""
        db = self._db
        _wait_for_lock(db, self.path, lambda: db.execute("PRAGMA journal_mode=WAL").fetchone())

    def _check_readable(self, version: int) -> None:
        tables = {
            r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: written by a newer hidvfs (results schema {version}; this version "
                f"reads up to {SCHEMA_VERSION}); upgrade hidvfs"
            )
        if version == 0 or "runs" not in tables:
            what = "an empty file" if not tables else f"tables {sorted(tables)}"
            raise StoreError(f"{self.path}: not a hidvfs results store ({what}, no runs table)")
        missing = [c for c, t in self._missing_columns() if "NOT NULL" in t or c in _CORE]
        if missing:
            raise StoreError(
                f"{self.path}: the runs table lacks column(s) {', '.join(missing)} (renamed or "
                "dropped?); not a results store this hidvfs can read"
            )

    def _missing_columns(self) -> list[tuple[str, str]]:
        have = {r[1] for r in self._db.execute("PRAGMA table_info(runs)")}
        return [(c, t) for c, t in _KEY_COLUMNS + _METRIC_COLUMNS + _BLOB_COLUMNS if c not in have]

    def _add_missing_columns(self) -> None:
        """A file from an older hidvfs lacks the columns added since (``cpu_energy_j`` ...):
        add them empty, so its runs stay readable and new runs can be stored beside them. A
        missing key column cannot be filled in and the file is refused."""
        missing = self._missing_columns()
        required = [c for c, t in missing if "NOT NULL" in t or c in _CORE]
        if required:
            raise StoreError(
                f"{self.path}: the runs table lacks the required column(s) {', '.join(required)} "
                "(renamed or dropped?); not a results store this hidvfs can extend (choose "
                "another --db)"
            )
        for c, t in missing:  # inside the caller's write transaction
            self._db.execute(f"ALTER TABLE runs ADD COLUMN {_q(c)} {t}")

    def _add_claims_table(self) -> None:
        """A file from before claims gains the table (inside the caller's write transaction);
        one of that name made by someone else is refused rather than written into."""
        self._db.execute(_CLAIMS_SCHEMA)
        have = {r[1] for r in self._db.execute("PRAGMA table_info(claims)")}
        if not _CLAIM_COLUMNS <= have:
            raise StoreError(
                f"{self.path}: its claims table lacks column(s) "
                f"{', '.join(sorted(_CLAIM_COLUMNS - have))}; not a results store this hidvfs "
                "can write (choose another --db)"
            )

    def _check_writable(self) -> None:
        """Fail now, before hours of runs, if no run could be stored: a write transaction that
        touches nothing is refused the same way a real insert would be (read-only file,
        folder or mount, or a lock held by another campaign)."""
        db = self._db

        def begin() -> None:
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("UPDATE runs SET id = id WHERE 0")
            except BaseException:
                if db.in_transaction:
                    db.rollback()
                raise

        try:
            _wait_for_lock(db, self.path, begin)
        except sqlite3.Error as err:
            raise StoreError(self._cannot_store(err)) from None
        db.execute("ROLLBACK")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self._execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def _execute(self, sql: str, params=()) -> sqlite3.Cursor:
        """A read on its own, waiting (and saying so) while another process holds the lock."""
        try:
            return _wait_for_lock(self._db, self.path, lambda: self._db.execute(sql, params))
        except sqlite3.OperationalError as err:
            if _error_code(err) in (_SQLITE_BUSY, _SQLITE_LOCKED):
                raise StoreError(_locked(self.path, err)) from None
            raise

    # -- writing ------------------------------------------------------------------------
    def add(self, record: Mapping[str, Any]) -> int:
        """Store one run record (replacing a row with the same key) and commit; returns its id."""
        key_text, vals = _row_values(record)
        cols = ["run_key", *vals]
        sql = (
            f"INSERT INTO runs ({', '.join(_q(c) for c in cols)}) "
            f"VALUES ({', '.join('?' for _ in cols)}) "
            "ON CONFLICT(run_key) DO UPDATE SET "
            + ", ".join(f"{_q(c)} = excluded.{_q(c)}" for c in vals)
        )
        db = self._db

        def insert() -> None:  # rolled back if it fails: safe to try again
            with db:  # the result and the end of its claim commit together
                db.execute(sql, [key_text, *vals.values()])
                db.execute("DELETE FROM claims WHERE run_key = ?", (key_text,))

        try:
            _wait_for_lock(db, self.path, insert)
            return _wait_for_lock(
                db,
                self.path,
                lambda: db.execute("SELECT id FROM runs WHERE run_key = ?", (key_text,)).fetchone(),
            )[0]
        except sqlite3.Error as err:
            # say what the lost run measured, so the message is all that is lost
            got = "ok" if vals["ok"] else f"failed: {vals['error']}"
            if vals["makespan_s"] is not None:
                got += f", makespan {vals['makespan_s']:.6g} s"
            if vals["energy_j"] is not None:
                got += f", energy {vals['energy_j']:.6g} J"
            raise StoreError(
                f"{self.path}: cannot store the run {run_key(record).label()} ({got}): {err}"
            ) from None

    # -- claims -------------------------------------------------------------------------
    def claim(
        self,
        key: RunKey,
        owner: Owner,
        *,
        redo: tuple | None = None,
        now: float | None = None,
        alive: Callable[[Owner], bool | None] = owner_alive,
    ) -> Claim:
        """Claim ``key`` for ``owner`` unless its result is stored or another live campaign
        holds it (:func:`decide_claim`), in one ``BEGIN IMMEDIATE`` transaction: of two
        campaigns asking at once, one gets it. ``redo``: the mark of the stored failure the
        campaign means to run again (:meth:`failure_marks`)."""
        text = _key_text(key)
        db = self._db

        def attempt() -> Claim:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT ok, started, ended, error FROM runs WHERE run_key = ?", (text,)
                ).fetchone()
                held = db.execute(
                    "SELECT owner, heartbeat FROM claims WHERE run_key = ?", (text,)
                ).fetchone()
                t = time.time() if now is None else now
                got = decide_claim(
                    stored=None if row is None else tuple(row),
                    redo=redo,
                    holder=None if held is None else held[0],
                    heartbeat=None if held is None else held[1],
                    me=owner,
                    now=t,
                    alive=alive,
                )
                if got.status == "claimed":
                    db.execute(_TAKE_CLAIM, (text, owner.text(), t))
                db.commit()
                return got
            except BaseException:
                if db.in_transaction:
                    db.rollback()
                raise

        return self._write(attempt, f"cannot claim the run {key.label()}")

    def release(self, key: RunKey, owner: Owner) -> None:
        """Give back ``owner``'s claim on ``key`` (its run failed to store or was
        interrupted), so that another campaign need not wait for it to go stale. A claim
        taken over since is the new owner's and stays."""
        db = self._db

        def delete() -> None:
            with db:
                db.execute(
                    "DELETE FROM claims WHERE run_key = ? AND owner = ?",
                    (_key_text(key), owner.text()),
                )

        self._write(delete, f"cannot release the claim on {key.label()}")

    def claims(self) -> dict[RunKey, tuple[str, float]]:
        """The claims held now: run key -> (owner ``host:pid:start``, heartbeat)."""
        out = {}
        for text, owner, beat in self._rows("SELECT run_key, owner, heartbeat FROM claims"):
            try:
                out[RunKey(*json.loads(text))] = (owner, beat)
            except (TypeError, ValueError):
                continue  # not a key this hidvfs wrote: it claims nothing it runs
        return out

    def heartbeat(self, owner: Owner, every_s: float | None = None) -> AbstractContextManager:
        """Keeps ``owner``'s claims fresh while the ``with`` block runs, every ``every_s``
        (:data:`~bots_bench.claims.CLAIM_HEARTBEAT_S`); nothing for a file in memory, which no
        other campaign can share."""
        if str(self.path) == ":memory:":
            return nullcontext()
        # read from the claims module at each call, so that a value set there acts
        return _Heartbeat(self.path, owner, every_s or claims.CLAIM_HEARTBEAT_S)

    def _write(self, attempt: Callable[[], _T], what: str) -> _T:
        """``attempt()`` (a write it rolls back on failure), waiting for the lock."""
        try:
            return _wait_for_lock(self._db, self.path, attempt)
        except sqlite3.Error as err:
            if _error_code(err) in (_SQLITE_BUSY, _SQLITE_LOCKED):
                raise StoreError(_locked(self.path, err)) from None
            raise StoreError(f"{self.path}: {what}: {err}") from None

    # -- reading ------------------------------------------------------------------------
    def failure_marks(self) -> dict[RunKey, tuple]:
        """The stored failed runs: key -> the mark :meth:`claim` compares (``redo``)."""
        sql = "SELECT id, run_key, ok, started, ended, error FROM runs WHERE ok = 0"
        return {self._decode_key(r[0], r[1]): tuple(r[2:]) for r in list(self._rows(sql))}

    def key_for(self, record: Mapping[str, Any]) -> RunKey:
        """The key a record is stored under (same as :func:`run_key`)."""
        return run_key(record)

    def done_keys(self, *, ok_only: bool = False) -> set[RunKey]:
        """Keys of the stored runs (only the successful ones with ``ok_only``)."""
        sql = "SELECT id, run_key FROM runs" + (" WHERE ok = 1" if ok_only else "")
        return {self._decode_key(rid, text) for rid, text in list(self._rows(sql))}

    def _decode_key(self, rid: object, text: Any) -> RunKey:
        try:
            return RunKey(*json.loads(text))
        except (TypeError, ValueError) as err:
            raise self._damaged(
                rid, f"column run_key: {text!r:.60} is not a run key ({err})"
            ) from None

    def _damaged(self, rid: object, what: str) -> StoreError:
        return StoreError(
            f"{self.path}: run {rid}: {what}; the file was edited or damaged: restore it, "
            'or delete that row (sqlite3 FILE "DELETE FROM runs WHERE id = N")'
        )

    def _rows(self, sql: str, params=()):
        """The rows of ``sql``, with an undecodable text said as the file's fault."""
        try:
            yield from self._execute(sql, params)
        except sqlite3.OperationalError as err:  # text that is not UTF-8, say
            raise StoreError(
                f"{self.path}: cannot read its runs ({err}); the file is damaged"
            ) from None

    def runs(
        self,
        filters: Mapping[str, Any] | None = None,
        *,
        with_stdout: bool = True,
        with_timeseries: bool = True,
    ) -> list[dict[str, Any]]:
        """Run records in insertion order. ``filters`` maps a column to a value or a list."""
        where, params = [], []
        for col, want in (filters or {}).items():
            if col not in FILTERABLE:
                raise StoreError(
                    f"cannot filter runs on {col!r}; filterable columns: {', '.join(sorted(FILTERABLE))}"
                )
            values = list(want) if isinstance(want, (list, tuple, set, frozenset)) else [want]
            values = [int(v) if isinstance(v, bool) else v for v in values]
            if not values:
                return []
            if any(v is None for v in values):
                rest = [v for v in values if v is not None]
                cond = f'"{col}" IS NULL'
                if rest:
                    cond = f'({cond} OR "{col}" IN ({", ".join("?" for _ in rest)}))'
                where.append(cond)
                params += rest
            else:
                where.append(f'"{col}" IN ({", ".join("?" for _ in values)})')
                params += values
        # the blobs left out are not read at all (a campaign's time series run to megabytes);
        # only the columns the file has (an older read-only file may lack the newer ones)
        skip = {
            c for c, want in (("stdout", with_stdout), ("timeseries", with_timeseries)) if not want
        }
        have = {r[1] for r in self._execute("PRAGMA table_info(runs)")}
        cols = ", ".join(["id", *(_q(c) for c in COLUMNS if c in have and c not in skip)])
        sql = (
            f"SELECT {cols} FROM runs"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY id"
        )
        out = []
        for r in self._rows(sql, params):
            try:
                out.append(_row_to_record(r, with_stdout, with_timeseries))
            except _BadRow as err:
                raise self._damaged(r["id"], str(err)) from None
        return out

    def ids_with_timeseries(self) -> list[int]:
        """Ids of the successful runs that carry a time series (without loading them)."""
        sql = "SELECT id FROM runs WHERE ok = 1 AND timeseries IS NOT NULL ORDER BY id"
        return [r[0] for r in self._execute(sql)]

    def get(self, run_id: int) -> dict[str, Any]:
        rows = self.runs({"id": run_id})
        if not rows:
            raise StoreError(f"{self.path}: no run with id {run_id}")
        return rows[0]

    # -- exports ------------------------------------------------------------------------
    def export_csv(
        self,
        path: str | os.PathLike[str],
        filters: Mapping[str, Any] | None = None,
        *,
        with_blobs: bool = False,
    ) -> int:
        """Write the runs as CSV (one row per run; config as JSON text); returns the row count.

        stdout and time series are left out unless ``with_blobs``.
        """
        rows = self.runs(filters, with_stdout=with_blobs, with_timeseries=with_blobs)
        fields = ["id", *[c for c in COLUMNS if c != "extra"]]
        if not with_blobs:
            fields = [f for f in fields if f not in ("stdout", "timeseries")]
        extra_keys = sorted({k for r in rows for k in r} - set(fields))
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(fields + extra_keys)
            for r in rows:
                out = []
                for k in fields + extra_keys:
                    v = r.get(k)
                    if isinstance(v, (dict, list)):
                        v = json.dumps(v, separators=(",", ":"))
                    out.append("" if v is None else v)
                w.writerow(out)
        return len(rows)

    def export_json(
        self,
        path: str | os.PathLike[str],
        filters: Mapping[str, Any] | None = None,
        *,
        with_blobs: bool = True,
    ) -> int:
        """Write the runs as a JSON list of run records; returns the record count."""
        rows = self.runs(filters, with_stdout=with_blobs, with_timeseries=with_blobs)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
        return len(rows)


#: the name the sim campaign CLI uses
ResultStore = Store
