"""``enable_mixed_precision_graph_rewrite(opt)``: the one-line entry point of the NVIDIA recipe.

It wraps the optimizer with loss scaling and marks it (``_tf_amp_graph_rewrite``) as wanting
the graph rewrite. Where the rewrite then happens:

* Keras: ``model.compile(optimizer=wrapped)`` hooks ``fit`` / ``evaluate`` / ``predict`` of that
  model (the compile hook is installed here and removed by ``disable_...``);
* custom loops: decorate the step with ``tf_amp.function`` instead of ``tf.function``;
* TF1: run the graph in ``tf_amp.Session`` instead of ``tf.compat.v1.Session``;
* or set ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` and change nothing (``tf_amp.runtime.activation``).

The rewrite is scoped to what the marked optimizer trains: unlike TF1's process-wide switch, a
plain ``tf.function`` or ``Session`` elsewhere in the process keeps running float32.
``is_rewrite_enabled()`` only reports whether ``enable_...`` was called since the last
``disable_...``; nothing changes behaviour on it.

Typical use::

    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam())
    model.compile(optimizer=opt, loss="mse")
"""

from __future__ import annotations

from typing import Any

from tf_amp.config import process_target
from tf_amp.optimizers import LossScaleOptimizer
from tf_amp.optimizers._settled import remember_choice, settings_for_this_machine
from tf_amp.runtime import _state, rewrite_switch
from tf_amp.runtime.rewrite_switch import mark_for_rewrite

__all__ = [
    "disable_mixed_precision_graph_rewrite",
    "enable_mixed_precision_graph_rewrite",
    "is_rewrite_enabled",
    "mark_for_rewrite",
    "optimizer_wants_rewrite",
]


def enable_mixed_precision_graph_rewrite(
    opt: Any, loss_scale: Any = "auto", **kwargs: Any
) -> Any:
    """Returns ``opt`` wrapped in a ``tf_amp.LossScaleOptimizer`` and turns the rewrite on.

    Args:
      opt: a Keras 3 optimizer, a tf_keras one (``tf_keras.optimizers.*`` or
        ``tf_keras.optimizers.legacy.*``) or a ``tf.compat.v1.train.Optimizer`` (not yet
        wrapped).
      loss_scale: ``"auto"`` (default): dynamic loss scaling where the target is float16 or
        a Keras global policy computes in float16 (``mixed_float16``: the wrapper stands in
        for the one Keras's ``compile`` would add), none where it is bfloat16 (float32's
        exponent range: nothing underflows, and the scaling work costs 3-8% of a step;
        but a Keras model whose own dtype policy computes in float16 turns it on at
        ``compile`` / ``fit``) or float32; ``"dynamic"``, a number (static) or a
        ``tf_amp.LossScale`` to ask for scaling whatever the target.
      **kwargs: passed to the wrapper (``enabled``, ``max_consecutive_skips``...).

    Where the target is float32 (``tf_amp.hardware``: no fast reduced precision on this
    machine) the optimizer is wrapped but not marked for the rewrite: nothing would change.

    Raises:
      ValueError: ``opt`` is already loss-scaled (by tf_amp or Keras); pass the original.
      TypeError: ``opt`` is not a supported optimizer; the message says what to pass.
    """
    target = process_target()
    settled_here = False
    if isinstance(loss_scale, str) and loss_scale == "auto":
        loss_scale = "dynamic"
        if "enabled" not in kwargs:
            # A pass-through wrapper (scale 1, no check, no skip) keeps the custom-loop API
            # (get_scaled_loss...) working and its saved files identical in layout.
            kwargs["enabled"], _ = settings_for_this_machine()
            settled_here = True
    wrapped = LossScaleOptimizer(opt, loss_scale=loss_scale, **kwargs)
    if settled_here:  # saved with it, so that a file loaded elsewhere is settled there
        remember_choice(wrapped)
    if not target.rewrites:
        # float32 target (no fast reduced precision here): nothing to rewrite, so no hook and
        # no rebuilt step either; fit runs Keras's own step, at float32's speed.
        return wrapped
    return mark_for_rewrite(wrapped)


def disable_mixed_precision_graph_rewrite() -> None:
    """Turns the process-wide rewrite flag off; optimizers already wrapped keep loss scaling.

    Also removes the compile hook (on Keras's ``Trainer.compile``) that ``enable_...``
    installed, so models compiled afterwards stay float32 (models already compiled keep theirs
    until recompiled).
    While the environment activation is on, its own hold on ``compile`` keeps the hook.

    Wrapped optimizers also lose their ``_tf_amp_graph_rewrite`` mark only if re-created, as in
    TF1: disabling affects graphs built afterwards.
    """
    rewrite_switch.turn_off()


def is_rewrite_enabled() -> bool:
    """True between ``enable_mixed_precision_graph_rewrite`` and ``disable_...``."""
    return _state.rewrite_enabled()


def optimizer_wants_rewrite(opt: Any) -> bool:
    """True for an optimizer returned by ``enable_mixed_precision_graph_rewrite``."""
    return _state.optimizer_wants_rewrite(opt)
