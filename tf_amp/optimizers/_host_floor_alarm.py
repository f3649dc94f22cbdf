"""The loss-scale floor checks on the host, for train steps XLA compiles.

XLA compiles no print or assert op, so a step built with ``jit_compile`` carries no in-graph
floor alarm (:mod:`tf_amp.optimizers._floor_alarm`); it counts instead what the alarm would
have said (:class:`~tf_amp.optimizers._floor_alarm.FloorEvents`). :class:`HostFloorAlarm` says
the same two warnings and raises the same error from those counts; :class:`ChecksSkipsOnHost`
gives the wrappers ``check_skips()``, which ``LossScaleCallback`` calls in ``fit`` after each
batch (each execution of ``steps_per_execution`` steps) and custom loops call after a step or
every few steps.
"""

from __future__ import annotations

import sys
import threading

import tensorflow as tf

from tf_amp.loss_scale import LossScale
from tf_amp.optimizers._floor_alarm import FloorEvents, fell_words, stuck_words, too_many_skips


class HostFloorAlarm:
    """The same two warnings and the same error as ``_floor_alarm.floor_alarm``, said on the
    host from the events XLA-compiled steps counted (``events``, made with the wrapper's state).

    Checked after every step, it says what the in-graph alarm says, on the same step. Checked
    less often, it misses nothing: each kind of event since the last check is said once, in the
    order fell, stuck, error, with "(N times since the last check)" when it happened more
    than once, and the run length of the last fall.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events = FloorEvents()
        self._last = dict.fromkeys(FloorEvents.FIELDS, 0)  # the counts at the last check

    def check(self, policy: LossScale, floor_warning_skips: int,
              max_consecutive_skips: int | None) -> None:
        """Prints the warnings due since the last check; raises ``InvalidArgumentError``, as
        the in-graph assert does, when a step ran with ``max_consecutive_skips`` skips in a row.
        Reads nothing (no host round trip) until an XLA-compiled step was traced."""
        if not self.events.armed:
            return
        now = self.events.read()
        new = {field: now[field] - self._last[field] for field in ("fell", "stuck", "too_many")}
        self._last = now
        min_scale = getattr(policy, "min_scale", 1.0)
        if new["fell"] > 0:
            before, after = fell_words(min_scale)
            print(before, now["fell_skips"], after + _times(new["fell"]), file=sys.stderr)
        if new["stuck"] > 0:
            before, after = stuck_words(min_scale)
            print(before, floor_warning_skips, after + _times(new["stuck"]), file=sys.stderr)
        if new["too_many"] > 0 and max_consecutive_skips:
            raise tf.errors.InvalidArgumentError(None, None, too_many_skips(max_consecutive_skips))


def _times(count: int) -> str:
    return f" ({count} times since the last check)" if count > 1 else ""


class ChecksSkipsOnHost:
    """Mixin of the Keras and tf_keras wrappers: :meth:`check_skips`.

    Thread-safe: Keras 3 may run ``LossScaleCallback``'s batch hook in its callback threads,
    several at once, while the next step runs; one lock makes each check read the counts
    and compare it with the last one as one unit, in order."""

    _host_floor_alarm: HostFloorAlarm  # made with the state variables
    _policy: LossScale
    enabled: bool
    floor_warning_skips: int
    max_consecutive_skips: int | None

    def check_skips(self) -> None:
        """Says on the host what steps compiled with XLA (``jit_compile``) cannot say inside
        themselves: the floor warnings and ``max_consecutive_skips``, from the events those
        steps counted. Call it in such a custom loop after a step or every few steps: nothing
        in between is missed (``LossScaleCallback`` calls it in Keras 3's ``fit``). Costs
        nothing until an XLA-compiled step was traced; a step not compiled with XLA has
        checked already and counts nothing."""
        if not self.enabled:
            return
        alarm = self._host_floor_alarm
        with alarm.lock:
            alarm.check(self._policy, self.floor_warning_skips, self.max_consecutive_skips)
