"""Counting the work a call does instead of timing it: Python bytecodes executed and calls
into C functions, both deterministic.

Why: time per node can rise with graph size for two reasons, more work per node (an
algorithm worse than linear) or dearer work (the working set outgrows a cache level, more
page faults). Timings cannot tell them apart; these counts can. Flat counts per node across
sizes with a rising time per node put the growth on the memory hierarchy, not the algorithm.
What the counts do not see: loops inside C (a ``list.index`` in a loop is one call each).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def count_python_work(fn: Callable[[], Any]) -> tuple[int, int]:
    """(bytecodes executed, C function calls made) while ``fn()`` runs in this thread.

    Uses ``sys.settrace`` with per-frame opcode events and ``sys.setprofile`` for ``c_call``
    events (the traced rewrite runs about 15x slower). It installs its own tracers and removes
    them after, so it refuses to run under another tracer (a debugger, coverage).
    """
    if sys.gettrace() is not None or sys.getprofile() is not None:
        raise RuntimeError("count_python_work cannot run under another tracer or profiler")
    bytecodes = 0
    c_calls = 0

    def on_opcode(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal bytecodes
        if event == "opcode":
            bytecodes += 1
        return on_opcode

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return on_opcode

    def on_profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal c_calls
        if event == "c_call":
            c_calls += 1

    sys.settrace(on_call)
    sys.setprofile(on_profile)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return bytecodes, c_calls
