"""The profile store keeps each measured profile's provenance beside it (when, on what, with
which hidvfs), and still reads the stores written before provenance was recorded."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from agents import deadlines
from daemon.profiles import ProfileLookup
from platforms.errors import SpecError
from platforms.observation import JobProfile

FIB = JobProfile("fib", 3.0, 0.6, 0.25, 1.25, 2035200, 4, version=2)
SORT = JobProfile("sort", 1.5, 0.3, 0.05, 0.5, 1984000, 4)
PROV = {
    "measured_at": "2025-06-01T12:00:00+00:00",
    "hidvfs_version": "0.1.0",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "board": "tx2",
    "kernel": "5.10.120-tegra",
    "cluster": "a57",
    "cpus": "0,3,4,5",
    "low_khz": "1113600",
    "repeat": "3",
}

#: rows exactly as `save` wrote them before provenance was recorded (asdict of the profile
#: after the board; the split span as null), and one from before the split span existed
OLD_ROWS = [
    {"board": "tx2", "name": "fib", "work_s": 3.0, "span_s": 0.6, "beta": 0.25,
     "ref_makespan_s": 1.25, "ref_khz": 2035200, "ref_cores": 4, "version": 2,
     "span_cpu_s": None, "span_mem_s": None},
    {"board": "tx2", "name": "sort", "work_s": 1.5, "span_s": 0.3, "beta": 0.05,
     "ref_makespan_s": 0.5, "ref_khz": 1984000, "ref_cores": 4, "version": 1},
]  # fmt: skip


def write_old_store(path, rows=OLD_ROWS):
    """A store in the format of the hidvfs before provenance: format, version 1, the rows;
    json.dumps with indent 1 and a newline, mode 0644."""
    data = {"format": "hidvfs-profiles", "version": 1, "profiles": rows}
    path.write_text(json.dumps(data, indent=1) + "\n")
    os.chmod(path, 0o644)
    return path


def test_an_old_store_loads_with_no_provenance(tmp_path):
    store = deadlines.load(write_old_store(tmp_path / "p.json"))
    assert store.find("fib", "tx2") == FIB and store.find("sort", "tx2") == SORT
    assert store.provenance_of("fib", "tx2") is None
    assert store.provenance_of("sort", "tx2") is None
    assert store.provenance == {}


def test_a_store_without_provenance_is_written_in_the_old_format_byte_for_byte(tmp_path):
    """Nothing measured with provenance yet: what an older hidvfs wrote is what this writes."""
    old = write_old_store(tmp_path / "old.json", OLD_ROWS[:1])
    s = deadlines.ProfileStore()
    s.put("tx2", FIB)
    deadlines.save(s, tmp_path / "new.json")
    assert (tmp_path / "new.json").read_bytes() == old.read_bytes()


def test_provenance_round_trips_through_save_and_load(tmp_path):
    s = deadlines.ProfileStore()
    s.put("tx2", FIB, provenance=PROV)
    s.put("tx2", SORT)  # none given: none recorded
    path = tmp_path / "p.json"
    deadlines.save(s, path)
    data = json.loads(path.read_text())
    assert data["format"] == "hidvfs-profiles" and data["version"] == 1  # no format bump
    fib_row = next(r for r in data["profiles"] if r["name"] == "fib")
    assert fib_row["provenance"] == PROV and list(fib_row)[-1] == "provenance"
    assert "provenance" not in next(r for r in data["profiles"] if r["name"] == "sort")
    back = deadlines.load(path)
    assert back.provenance_of("fib", "tx2") == PROV
    assert back.provenance_of("sort", "tx2") is None
    assert back.profiles == s.profiles and back.provenance == s.provenance
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_the_profile_the_daemon_plans_with_carries_no_provenance(tmp_path):
    """Provenance stays beside the profile: the JobProfile a registration gets (and every
    tick plans with) is the same object type, with the same fields and value, as before."""
    assert "provenance" not in {f.name for f in dataclasses.fields(JobProfile)}
    path = tmp_path / "p.json"
    deadlines.update(path, "tx2", FIB, provenance=PROV)
    got = ProfileLookup(path, "tx2")("fib")
    assert type(got) is JobProfile and got == FIB
    hash(got)  # still hashable (a dict field would not be)


def test_update_records_and_replacing_renews_the_provenance(tmp_path):
    path = tmp_path / "p.json"
    deadlines.update(path, "tx2", FIB, provenance=PROV)
    newer = {**PROV, "measured_at": "2025-07-01T08:30:00+00:00", "hidvfs_version": "0.2.0"}
    faster = dataclasses.replace(FIB, ref_makespan_s=1.0)
    with pytest.raises(ValueError, match="--replace"):  # frozen: nothing changes
        deadlines.update(path, "tx2", faster, provenance=newer)
    assert deadlines.load(path).provenance_of("fib", "tx2") == PROV
    stored = deadlines.update(path, "tx2", faster, replace_existing=True, provenance=newer)
    assert stored.version == 3
    assert deadlines.load(path).provenance_of("fib", "tx2") == newer
    # the same numbers measured again: the version stays, the provenance is the latest one
    latest = {**newer, "measured_at": "2025-08-01T00:00:00+00:00"}
    assert deadlines.update(path, "tx2", faster, provenance=latest).version == 3
    assert deadlines.load(path).provenance_of("fib", "tx2") == latest
    # a new profile put without provenance does not inherit the old measurement's
    s = deadlines.load(path)
    s.put("tx2", dataclasses.replace(FIB, ref_makespan_s=0.9), replace_existing=True)
    assert s.provenance_of("fib", "tx2") is None


def test_a_measured_profile_added_to_an_old_store_leaves_its_rows_as_they_were(tmp_path):
    path = write_old_store(tmp_path / "p.json", OLD_ROWS[:1])
    deadlines.update(path, "orin-nx", SORT, provenance={**PROV, "board": "orin-nx"})
    rows = json.loads(path.read_text())["profiles"]
    assert rows[0] == OLD_ROWS[0]  # fib on tx2: no provenance key made up for it
    assert rows[1]["name"] == "sort" and rows[1]["provenance"]["board"] == "orin-nx"


def test_remove_keeps_the_other_profiles_provenance(tmp_path):
    path = tmp_path / "p.json"
    deadlines.update(path, "tx2", FIB, provenance=PROV)
    deadlines.update(path, "tx2", SORT, provenance={**PROV, "repeat": "1"})
    deadlines.update(path, "orin-nx", FIB)  # an old-style row beside them
    deadlines.remove(path, "fib", "tx2")
    s = deadlines.load(path)
    assert sorted(s.profiles) == [("fib", "orin-nx"), ("sort", "tx2")]
    assert s.provenance_of("sort", "tx2") == {**PROV, "repeat": "1"}
    assert s.provenance_of("fib", "orin-nx") is None


@pytest.mark.parametrize("bad", ["2025-06-01", ["measured_at"], {"measured_at": 1}, {"": "x"}])
def test_a_provenance_that_is_not_a_mapping_of_strings_is_refused(tmp_path, bad):
    path = tmp_path / "p.json"
    write_old_store(path, [{**OLD_ROWS[0], "provenance": bad}])
    with pytest.raises(SpecError, match=r"profiles\[0\]\.provenance"):
        deadlines.load(path)
    with pytest.raises(ValueError):
        deadlines.ProfileStore().put("tx2", FIB, provenance=bad)


def test_a_null_provenance_reads_as_unknown(tmp_path):
    """`profile show --json` prints null for an unknown provenance: a row made from it loads."""
    path = write_old_store(tmp_path / "p.json", [{**OLD_ROWS[0], "provenance": None}])
    s = deadlines.load(path)
    assert s.find("fib", "tx2") == FIB and s.provenance_of("fib", "tx2") is None


def test_a_measurement_keeps_the_stores_mode(tmp_path):
    """An administrator's 0600 on the store survives the next measurement (as `remove`
    keeps it); a new store is readable by everyone (`profile list` without root)."""
    path = tmp_path / "p.json"
    deadlines.update(path, "tx2", FIB, provenance=PROV)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    os.chmod(path, 0o600)
    deadlines.update(path, "tx2", SORT)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert deadlines.load(path).find("sort", "tx2") is not None
