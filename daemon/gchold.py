"""Python's cyclic garbage collector, kept off the path from a reading to its actuation.

The collector runs whenever allocations cross its thresholds, wherever the program happens
to be. A decision allocates a few hundred containers, so about one tick in three paid for a
young collection somewhere between the sysfs reads and the writes, and now and then for a
full one: about 6 ms with the models loaded (31k objects), several decisions' worth. Held while
the tick senses, decides and actuates, the collection the tick made due runs at the first
allocation after it, under the interpreter's own generational policy, in the slack before
the next tick. Frozen once the daemon has started, the objects of the start (models,
sessions, modules, config) are never walked again by a full collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_held() -> Iterator[None]:
    """No automatic collection inside the block; what it made due runs right after it.

    A collector that was already disabled (by the embedding program) stays disabled.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def start_frozen() -> Iterator[int]:
    """Collect once, then keep every surviving object out of the collector's reach
    (:func:`gc.freeze`) until the block ends; yields how many objects were frozen.

    Entered when the start is done and the loop about to run: what the start made lives as
    long as the daemon. On the way out the objects go back to the oldest generation, so a
    process that runs the daemon and goes on (the tests, ``--duration``) loses nothing.
    """
    gc.collect()
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()
