"""Loss scaling for Keras 3 optimizers: a wrapper that is itself a ``keras.optimizers.Optimizer``.

Because the wrapper is an optimizer, ``compile``/``fit``/``model.save``/``load_model`` and
``tf.train.Checkpoint`` take it unchanged, and its state (scale and counters) lives in optimizer
variables that every save format already handles.

Typical use::

    opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-3))        # dynamic scaling
    model.compile(optimizer=opt, loss="mse"); model.fit(x, y)

    # custom loop, Keras 3 style
    with tf.GradientTape() as tape:
        loss = opt.scale_loss(loss_fn())
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    # custom loop, TF2 guide style (get_scaled_loss / get_unscaled_gradients)
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, vs))
    opt.apply_gradients(zip(grads, vs))

Per step the wrapper unscales every gradient and checks finiteness with one fused op, ANDs the
flag across replicas, applies the inner optimizer under a ``tf.cond`` (a skipped step leaves
weights, slots and ``iterations`` untouched) and moves the scale with ``tf_amp.loss_scale``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_amp import loss_scale as loss_scale_lib
from tf_amp._upstream.keras import no_automatic_dependency_tracking
from tf_amp.ops import unscale_and_check_finite
from tf_amp.optimizers import (
    _apply_or_skip,
    _common,
    _keras_arguments,
    _keras_config,
    _scaled_losses,
    _settled,
    _summaries,
)
from tf_amp.optimizers._checkpoint_layout import InnerCheckpointLayout
from tf_amp.optimizers._keras_arguments import FORWARDED_ATTRIBUTES, DelegatesToInner
from tf_amp.optimizers._keras_saving import SavesAsInner
from tf_amp.optimizers._keras_state import LossScaleStateOwner
from tf_amp.optimizers._unscaled_marks import (
    UnscaledMarks,
    current_graph,
    warn_unscaled_never_scaled,
)
from tf_amp.optimizers.callback import LossScaleCallback
from tf_amp.runtime._state import optimizer_wants_rewrite


@keras.saving.register_keras_serializable(package="tf_amp")
class KerasLossScaleOptimizer(
    SavesAsInner,
    InnerCheckpointLayout,
    LossScaleStateOwner,
    DelegatesToInner,
    keras.optimizers.LossScaleOptimizer,
):
    """Dynamic or static loss scaling around a Keras 3 optimizer.

    It subclasses ``keras.optimizers.LossScaleOptimizer`` only so that Keras recognises it as
    a loss-scale optimizer: ``compile`` under a ``mixed_float16`` policy would otherwise wrap it
    in Keras's own and scale the loss twice. Every method Keras's class implements is replaced
    here; none of its code runs.

    Args:
      inner_optimizer: the ``keras.optimizers.Optimizer`` that applies the unscaled gradients.
        Clipping (``clipnorm``...), weight decay and ``gradient_accumulation_steps`` stay on it
        and act on unscaled gradients.
      loss_scale: ``"dynamic"``, a number (static scale) or a ``tf_amp.LossScale``.
      enabled: ``False`` makes the wrapper a pass-through (scale 1, no check, no skipping), so
        one script can toggle mixed precision with a flag, like GradScaler(enabled=False).
      floor_warning_skips: warn when this many steps in a row are skipped with the scale at
        its floor (0 disables the warning).
      max_consecutive_skips: raise ``InvalidArgumentError`` after this many consecutive
        skipped steps (``None``: never).
        A step compiled with XLA cannot print or assert, so there both checks run on the host:
        in ``fit`` with ``LossScaleCallback``, in a custom loop with :meth:`check_skips`.
      name: optimizer name.
    """

    _tf_amp_loss_scale_wrapper = True

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        loss_scale: Any = "dynamic",
        enabled: bool = True,
        floor_warning_skips: int = _common.FLOOR_WARNING_SKIPS,
        max_consecutive_skips: int | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        loss_scale = _keras_arguments.check_arguments(
            inner_optimizer, loss_scale, max_consecutive_skips, kwargs
        )
        # Every argument is checked before the inner optimizer is marked as wrapped.
        policy = loss_scale_lib.get(loss_scale)
        skip_limits = _common.checked_skip_limits(floor_warning_skips, max_consecutive_skips)
        # Skip keras.optimizers.LossScaleOptimizer.__init__ (its own scale and arguments).
        super(keras.optimizers.LossScaleOptimizer, self).__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        _common.mark_wrapped(inner_optimizer, self)
        self._policy = policy
        self.enabled = bool(enabled)
        self.floor_warning_skips, self.max_consecutive_skips = skip_limits
        self._unscaled_marks = UnscaledMarks()
        self._create_state()

    # ----------------------------------------------------------------------------- state
    @no_automatic_dependency_tracking
    def build(self, var_list: Sequence[Any]) -> None:
        self.inner_optimizer.build(var_list)
        # Only the bookkeeping of Keras's base build: its EMA copies and gradient accumulators
        # (use_ema, gradient_accumulation_steps, read from the inner optimizer) live there.
        var_list = list(var_list)
        for i, variable in enumerate(var_list):
            self._trainable_variables_indices[self._var_key(variable)] = i
        self._trainable_variables = var_list[:]
        self.built = True

    @property
    def variables(self) -> list[Any]:
        return self._variables + self.inner_optimizer.variables

    # ------------------------------------------------------------------- custom-loop API
    def scale_loss(self, loss: Any) -> Any:
        """``loss * scale`` (in float32 for 16-bit losses); Keras's ``fit`` calls this."""
        if callable(loss):
            return lambda: self.scale_loss(loss())
        if not self.enabled:
            return loss
        self._unscaled_marks.new_step()  # a new scaled loss: earlier unscales are not this step's
        state = self._state()
        return _scaled_losses.mark(self._policy.scale(loss, state))

    def get_scaled_loss(self, loss: Any) -> Any:
        """TF2 mixed-precision guide name for :meth:`scale_loss`."""
        return self.scale_loss(loss)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Divides gradients by the scale (fused op); ``apply`` will not divide them again.

        Like GradScaler.unscale_, this opens the current step: its ``apply``/``apply_gradients``
        then only checks finiteness of the returned tensors, or of tensors derived from them
        (so clipping between the two calls sees true gradients). Given the very tensors passed
        here instead (unscaled only to be logged), ``apply`` unscales them as usual. The step
        is this thread's, in this graph (an ``apply`` in an enclosing graph, after a loop whose
        body unscaled, or in a ``tf.function`` called after an eager unscale belongs to it;
        one in another, separately traced function is an error), and ends at its ``apply`` or
        at the next
        ``scale_loss``/``get_scaled_loss``: an unscale whose ``apply`` never came (an exception,
        a look at the gradients) does not reach the next step. Calling it twice in one step is
        an error, since the second call would unscale already unscaled gradients.
        """
        if not self.enabled:
            return list(grads)
        if self._unscaled_marks.find()[1] is not None:
            raise RuntimeError(
                "get_unscaled_gradients() was already called since the last apply(); "
                "gradients would be unscaled twice"
            )
        grads = list(grads)
        scale = self.loss_scale
        unscaled, _ = unscale_and_check_finite(grads, scale)
        self._unscaled_marks.open(grads, unscaled)
        return unscaled

    # --------------------------------------------------------------------------- apply
    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> None:
        """Unscales ``grads`` (gradients of ``scale_loss(loss)``) and applies them if finite.

        One fused op unscales and checks all gradients, the flag is ANDed over replicas, and a
        ``tf.cond`` either runs the inner optimizer (then maybe grows the scale) or skips the
        step entirely (then backs the scale off): no host sync either way. After
        ``get_unscaled_gradients`` the gradients are only checked, not unscaled again.
        """
        if not self.built:
            # Built even when disabled, so a saved file has the same variables either way.
            if trainable_variables is None:
                raise ValueError(
                    "pass trainable_variables on the first apply() (or call "
                    "build(trainable_variables) first)"
                )
            with keras.name_scope(self.name, caller=self):
                self.build(list(trainable_variables))
        if not self.enabled:
            self.inner_optimizer.apply(grads, trainable_variables)
            return None
        grads = list(grads)
        variables = (
            list(trainable_variables)
            if trainable_variables is not None
            else list(self._trainable_variables)
        )
        if tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy():
            raise ValueError("apply() must be called in a replica context (strategy.run).")

        graph, mark = self._unscaled_marks.find()
        if not self._unscaled_marks.take_scaled() and mark is None:
            warn_unscaled_never_scaled()
        already = False
        if mark is not None:
            # A trace does not consume an eager unscale: tf.function may trace apply() twice
            # (the first trace creates the optimizer's variables), and the next eager
            # get_scaled_loss() ends that step anyway.
            if graph is not None or current_graph() is None:
                self._unscaled_marks.close(graph)
            already = mark.classify(grads)
        state_vars = [v.value for v in self._state_vars]
        scale = tf.convert_to_tensor(state_vars[0])
        # Variables Keras overwrites with their gradient (float8 scales) are no gradients to
        # unscale. The attribute itself: Keras < 3.10 has no _overwrite_variable_with_gradient.
        raw = [
            None if g is None or getattr(v, "overwrite_with_gradient", False) else g
            for g, v in zip(grads, variables, strict=True)
        ]
        unscaled, finite = unscale_and_check_finite(raw, tf.constant(1.0) if already else scale)
        unscaled = [u if r is not None else g for u, r, g in zip(unscaled, raw, grads, strict=True)]
        # ... but a non-finite one still skips the step, as Keras's own wrapper does: written
        # into a float8 amax history, an inf would poison every later step.
        overwritten = [
            tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g)))
            for g, r in zip(grads, raw, strict=True)
            if g is not None and r is None
        ]
        if overwritten:
            finite = tf.logical_and(finite, tf.reduce_all(tf.stack(overwritten)))
        finite = _apply_or_skip.all_replicas_finite(finite)

        done = _apply_or_skip.apply_if_finite(
            finite,
            self.inner_optimizer.apply,
            unscaled,
            trainable_variables,
            self._policy,
            state_vars,
            self.floor_warning_skips,
            self.max_consecutive_skips,
            events=self._host_floor_alarm.events,
        )
        with tf.control_dependencies([done] if done is not None else []):
            _summaries.write_summaries(state_vars[0], state_vars[2], self.iterations)
        return None

    def apply_gradients(self, grads_and_vars: Any) -> Any:
        grads, variables = zip(*grads_and_vars, strict=True)
        self.apply(grads, variables)
        return self.iterations  # the inner optimizer's count, which skipped steps leave alone

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise NotImplementedError(
            "tf_amp's LossScaleOptimizer supports the TensorFlow backend only (stateful apply)"
        )

    # ----------------------------------------------------------------- serialization
    def get_config(self) -> dict[str, Any]:
        graph_rewrite = optimizer_wants_rewrite(self)
        return _keras_config.wrapper_config(self, graph_rewrite)

    @classmethod
    def from_config(
        cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None
    ) -> KerasLossScaleOptimizer:
        """Builds the wrapper from its own config, or from one of Keras 3's, tf.keras 2.x's or
        TF 2.3's LossScaleOptimizer (see ``tf_amp.optimizers._keras_config``)."""
        config = dict(config)
        inner = _keras_config.inner_from_config(config, custom_objects)
        policy = _keras_config.policy_from_config(config)
        graph_rewrite = config.pop("graph_rewrite", False)  # absent in files saved before it
        settled, graph_rewrite = _settled.settle_loaded_config(config, graph_rewrite)
        optimizer = cls(inner, loss_scale=policy, **config)
        if settled:
            _settled.remember_choice(optimizer)
        if graph_rewrite:
            # On use: the switch loads the Keras adapter and the rewriter, which a wrapper
            # that never asked for the rewrite does not need.
            from tf_amp.runtime.rewrite_switch import mark_for_rewrite

            mark_for_rewrite(optimizer)
        return optimizer


for _name in FORWARDED_ATTRIBUTES:
    setattr(KerasLossScaleOptimizer, _name, _keras_arguments.forwarded(_name))


__all__ = ["FORWARDED_ATTRIBUTES", "KerasLossScaleOptimizer", "LossScaleCallback"]
