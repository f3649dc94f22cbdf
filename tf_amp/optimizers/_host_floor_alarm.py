"""The loss-scale floor checks on the host, for train steps XLA compiles.

XLA compiles no print or assert op, so a step built with ``jit_compile`` carries no in-graph
floor alarm (:mod:`tf_amp.optimizers._floor_alarm`). :class:`HostFloorAlarm` decides the same
two warnings and the same error from the wrapper's state variables read after a step;
:class:`ChecksSkipsOnHost` gives the wrappers ``check_skips()``, which ``LossScaleCallback``
calls in ``fit`` after each batch and custom loops call after a step.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.optimizers._floor_alarm import fell_words, stuck_words, too_many_skips


class HostFloorAlarm:
    """The same two warnings and the same error as ``_floor_alarm.floor_alarm``, decided on the host
    from the state variables read after one or more steps (for steps XLA compiles).

    Reading after every step says what the in-graph alarm says, on the same step. Reading less
    often (``steps_per_execution`` > 1) sees only the state each execution ends with: a run of
    skips that a finite step ends within one execution is not seen (no warning, no error).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._last: tuple[float, int] | None = None  # (scale, floor_skips) at the last check

    def check(
        self,
        policy: LossScale,
        floor_warning_skips: int,
        max_consecutive_skips: int | None,
        state: LossScaleState,
    ) -> None:
        """Prints the warnings due since the last check of ``state`` (the wrapper's state,
        read as numbers); raises ``InvalidArgumentError``, as the in-graph assert does, after
        ``max_consecutive_skips`` skips in a row."""
        scale, skips, floor_skips = (
            float(state.scale), int(state.consecutive_skips), int(state.floor_skips)
        )
        last_scale, last_floor_skips = self._last or (float("inf"), 0)
        if floor_skips < last_floor_skips:
            last_floor_skips = 0  # a finite step in between started a new run of skips
        self._last = (scale, floor_skips)
        if policy.dynamic and floor_warning_skips > 0 and skips > 0:
            min_scale = getattr(policy, "min_scale", 1.0)
            floor = float(np.float32(min_scale))  # the scale is a float32, as the graph compares
            if last_scale > floor >= scale:
                before, after = fell_words(min_scale)
                print(before, skips, after, file=sys.stderr)
            if last_floor_skips < floor_warning_skips <= floor_skips:
                before, after = stuck_words(min_scale)
                print(before, floor_skips, after, file=sys.stderr)
        if max_consecutive_skips and skips >= max_consecutive_skips:
            raise tf.errors.InvalidArgumentError(None, None, too_many_skips(max_consecutive_skips))


class ChecksSkipsOnHost:
    """Mixin of the Keras and tf_keras wrappers: :meth:`check_skips`.

    Thread-safe: Keras 3 may run ``LossScaleCallback``'s batch hook in its callback threads,
    several at once, while the next step runs; one lock makes each check read the state
    and compare it with the last one as one unit, in order."""

    _state_vars: list[Any]
    _host_floor_alarm: HostFloorAlarm  # made with the state variables
    _policy: LossScale
    enabled: bool
    floor_warning_skips: int
    max_consecutive_skips: int | None

    def check_skips(self) -> None:
        """Checks on the host what a step compiled with XLA (``jit_compile``) cannot check
        inside itself: the floor warnings and ``max_consecutive_skips``, from the state the
        last step left. Call it after each step of such a custom loop (``LossScaleCallback``
        does in Keras 3's ``fit``); a step not compiled with XLA has checked already."""
        if not self.enabled:
            return
        alarm = self._host_floor_alarm
        with alarm.lock:
            alarm.check(
                self._policy,
                self.floor_warning_skips,
                self.max_consecutive_skips,
                LossScaleState(*(v.numpy() for v in self._state_vars)),
            )
