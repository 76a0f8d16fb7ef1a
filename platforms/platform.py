"""A board handle: spec + sysfs backend + process control + clock, built in one place."""

from __future__ import annotations

from dataclasses import dataclass

from platforms.clock import Clock
from platforms.procs import ProcessControl
from platforms.spec import BoardSpec
from platforms.sysfs import SysfsBackend


@dataclass
class Platform:
    spec: BoardSpec
    sysfs: SysfsBackend
    procs: ProcessControl
    clock: Clock
    #: "live", "fake", "replay" or "sim"
    kind: str = "live"
