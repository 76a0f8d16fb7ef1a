"""The resumable campaign loop: run every config whose result is not stored yet.

:func:`run_pending` is the loop ``hidvfs bots run`` drives, sim or native: skip what is
stored, claim each run (:mod:`bots_bench.claims`), run it, store it (:mod:`bots_bench.store`),
then wait for the runs other campaigns on the same file hold. It is apart from the store so
that the store is only the results database, and the loop that fills it reads in one place.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bots_bench.claims import CLAIM_POLL_S, Owner, decide_claim, waiting_message
from bots_bench.store import RunKey, Store, StoreError, run_key

#: how often a campaign waiting for runs another campaign claimed says so again on stderr
_WAIT_NOTICE_EVERY_S = 60.0


@dataclass
class CampaignSummary:
    executed: int = 0
    skipped: int = 0
    failed: int = 0
    ids: list[int] | None = None
    #: the key of every config given, run or skipped (what a caller's table should show)
    keys: set[RunKey] = field(default_factory=set)
    #: runs another campaign on the same file ran (it held them, or had stored them, when
    #: this one came to them); their results are stored like this campaign's
    by_others: int = 0
    #: runs this campaign took over from a dead owner or a stale claim
    taken_over: int = 0
    #: the owners (``host:pid:start``) of the claims this campaign found held
    others: set[str] = field(default_factory=set)


def _key_of(config: Any) -> RunKey:
    key = getattr(config, "key", None)
    return key if isinstance(key, RunKey) else run_key(config)


def _base_of(config: Any) -> dict[str, Any]:
    if hasattr(config, "record_base"):
        return dict(config.record_base())
    return dict(config)


def _now_iso() -> str:
    """Wall-clock time with its UTC offset, to the second (a run's ``started``/``ended``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _run_record(cfg: Any, key: RunKey, run_fn: Callable[[Any], Mapping[str, Any]]) -> dict:
    """The record of one run of ``cfg``: an exception from ``run_fn`` is a failed run, and
    the config's key fields fill what the record leaves out."""
    base = _base_of(cfg)
    started = _now_iso()
    try:
        record = dict(run_fn(cfg))
    except Exception as err:  # a broken run is a result, not the end of the campaign
        record = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    record.setdefault("started", started)
    record.setdefault("ended", _now_iso())
    for k, v in base.items():
        record.setdefault(k, v)
    if run_key(record) != key:
        raise StoreError(
            f"run function changed the key of {key.label()}: got {run_key(record).label()}"
        )
    return record


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class _Campaign:
    """The state of one :func:`run_pending`: what it ran, what it left to other campaigns
    (``held``: key -> (config, the holder's owner text)) and what it reports."""

    store: Store
    run_fn: Callable[[Any], Mapping[str, Any]]
    owner: Owner
    #: stored failures to run again: key -> mark (:meth:`Store.failure_marks`)
    redo: dict[RunKey, tuple]
    done: set[RunKey]
    on_start: Callable[[Any], None] | None = None
    on_done: Callable[[Any, Mapping[str, Any]], None] | None = None
    on_other: Callable[[Any], None] | None = None
    on_wait: Callable[[str], None] = _say
    summary: CampaignSummary = field(default_factory=lambda: CampaignSummary(ids=[]))
    held: dict[RunKey, tuple[Any, str]] = field(default_factory=dict)

    def offer(self, cfg: Any, key: RunKey) -> None:
        """Run ``cfg`` if it is this campaign's to run; else leave it to its holder."""
        got = self.store.claim(key, self.owner, redo=self.redo.get(key))
        if got.status == "held":
            self.held[key] = (cfg, got.holder or "")
            self.summary.others.add(got.holder or "")
        elif got.status == "done":  # stored by another campaign since this one started
            self.summary.by_others += 1
            self.done.add(key)
            if self.on_other:
                self.on_other(cfg)
        else:
            self.summary.taken_over += got.took_over is not None
            self.run(cfg, key)

    def run(self, cfg: Any, key: RunKey) -> None:
        """Run a claimed config and store it; the claim goes with the stored result, or is
        given back when the run is interrupted or cannot be stored."""
        if self.on_start:
            self.on_start(cfg)
        try:
            record = _run_record(cfg, key, self.run_fn)
            self.summary.ids.append(self.store.add(record))
        except BaseException:
            self._release(key)
            raise
        self.summary.executed += 1
        self.summary.failed += 0 if record.get("ok") else 1
        self.done.add(key)
        if self.on_done:
            self.on_done(cfg, record)

    def _release(self, key: RunKey) -> None:
        try:
            self.store.release(key, self.owner)
        except StoreError:  # the error in flight says more; the claim will go stale
            pass

    def wait_for_others(self, poll_s: float) -> None:
        """Wait for the runs other campaigns held until their results are stored (counted
        as theirs) or their claims are given back, dead or stale (then run here), saying so
        on stderr when the wait begins and every minute after."""
        said_at: float | None = None
        while self.held:
            moved = self._poll()
            if not self.held:
                break
            now = time.monotonic()
            if said_at is None or now - said_at >= _WAIT_NOTICE_EVERY_S:
                holders = [h for _, h in self.held.values()]
                self.on_wait(waiting_message(len(self.held), holders, self.store.path))
                said_at = now
            if not moved:
                time.sleep(poll_s)

    def _poll(self) -> bool:
        """Offer again each held run whose claim is no longer a live campaign's (read first,
        so a run still held costs no write transaction); whether any moved."""
        claims, now, moved = self.store.claims(), time.time(), False
        for key, (cfg, _) in list(self.held.items()):
            cur = claims.get(key)
            if cur is not None:
                got = decide_claim(
                    stored=None, redo=None, holder=cur[0], heartbeat=cur[1], me=self.owner, now=now
                )
                if got.status == "held":
                    self.held[key] = (cfg, cur[0])
                    continue
            del self.held[key]
            moved = True
            self.offer(cfg, key)
        return moved


def run_pending(
    configs: Iterable[Any],
    run_fn: Callable[[Any], Mapping[str, Any]],
    store: Store,
    *,
    retry_failed: bool = False,
    on_skip: Callable[[Any], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
    on_done: Callable[[Any, Mapping[str, Any]], None] | None = None,
    on_other: Callable[[Any], None] | None = None,
    on_wait: Callable[[str], None] = _say,
    owner: Owner | None = None,
    poll_s: float = CLAIM_POLL_S,
) -> CampaignSummary:
    """Run every config whose key is not stored yet, storing each record as it finishes.

    ``configs`` are :class:`~bots_bench.spec.RunConfig` (``.key``, ``.record_base()``) or run
    record dicts. ``run_fn(config)`` returns the run record; the key fields of the config
    fill what it leaves out. An exception from ``run_fn`` is stored as a failed run
    (``ok=False``, ``error``) and the campaign goes on; ``KeyboardInterrupt`` stops it with
    every finished run already committed. ``retry_failed`` re-runs stored failures; the new
    record replaces the failed row (one row per key), and successful runs are never re-run.

    Campaigns on one file share its runs: each run is claimed first (:meth:`Store.claim`),
    one another live campaign holds is left to it (``on_other`` when its result is found),
    and those are waited for at the end (``on_wait`` says so), so that every config has a
    stored result on return. ``owner`` defaults to this process.
    """
    # the failures first: one another campaign stores again in between is then not ours
    redo = store.failure_marks() if retry_failed else {}
    done = store.done_keys(ok_only=retry_failed)
    camp = _Campaign(
        store,
        run_fn,
        owner or Owner.current(),
        redo,
        done,
        on_start=on_start,
        on_done=on_done,
        on_other=on_other,
        on_wait=on_wait,
    )
    with store.heartbeat(camp.owner):
        for cfg in configs:
            key = _key_of(cfg)
            camp.summary.keys.add(key)
            if key in done or key in camp.held:  # stored, or given twice
                camp.summary.skipped += 1
                if on_skip:
                    on_skip(cfg)
                continue
            camp.offer(cfg, key)
        camp.wait_for_others(poll_s)
    return camp.summary
