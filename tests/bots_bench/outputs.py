"""Result blocks as BOTS binaries print them, for the stand-in binaries of the native tests."""

from __future__ import annotations


def fib_block(seconds: float) -> str:
    """A fib run's result block (N = 25, 2 threads, verified) that took ``seconds``."""
    return (
        "Program             = Fibonacci\n"
        "Parameters          = N=25\n"
        "Model               = OpenMP (using tasks)\n"
        "Embedded cut-off    = none\n"
        "# of Threads        = 2\n"
        "Verification        = successful\n"
        f"Time Program        = {seconds} seconds\n"
    )


def sparselu_serial_block(seconds: float) -> str:
    """The serial sparselu's result block: no version in its Program, and it cannot check."""
    return (
        "Program             = SparseLU\n"
        "Parameters          = S1=10x10, S2=25x25\n"
        "Model               = Serial\n"
        "Embedded cut-off    = none\n"
        "# of Threads        = 1\n"
        "Verification        = n/a\n"
        f"Time Program        = {seconds} seconds\n"
    )
