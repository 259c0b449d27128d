"""Keep Z3's finalisers on the thread that uses Z3.

Z3's Python API is not thread-safe, and ctypes releases the GIL during every Z3 call. Python's
cyclic garbage collector runs on whichever thread happens to allocate, so while a solver call holds
Z3's context on one thread, the collector can run a Z3 object's `__del__` (a `Z3_dec_ref`) on
another thread, for example a gRPC server's event loop in the same process (the demo, the test
suite). That crashed the interpreter once in CI. Engines therefore run with the cyclic collector
paused and collect their own garbage on the calling thread before resuming it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def z3_on_this_thread() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        if was_enabled:
            gc.enable()
