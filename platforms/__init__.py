"""Hardware and simulated hardware: board specs, sysfs backends, the plant simulator.

This is the only layer that touches sysfs, processes or the clock. Everything above it
receives plain values (dataclasses, numpy arrays) and returns decisions.
"""
