"""What both tf_keras wrappers share: construction, the tf.keras 2.x custom-loop API, and the
step (unscale, check, apply or skip).

The two wrappers (:mod:`tf_amp.optimizers._tf_keras_current` around ``tf_keras.optimizers.*``,
:mod:`tf_amp.optimizers._tf_keras_legacy` around ``OptimizerV2``) differ only in the
signatures of ``minimize`` / ``apply_gradients`` and in how the inner optimizer creates its
slots; everything that decides a step is here, once, and uses the same pieces as the Keras 3
wrapper (the fused unscale-and-check op, :mod:`tf_amp.optimizers._apply_or_skip`, the
unscale marks of :mod:`tf_amp.optimizers._unscaled_marks`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from tf_amp import loss_scale as loss_scale_lib
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp._upstream import tf_keras as upstream
from tf_amp.loss_scale import LossScaleState
from tf_amp.ops import unscale_and_check_finite
from tf_amp.optimizers import _apply_or_skip, _common, _scaled_losses, _summaries
from tf_amp.optimizers._apply_or_skip import KeepWhole
from tf_amp.optimizers._checkpoint_layout import TF_STATE_NAMES, StateTrackable
from tf_amp.optimizers._host_floor_alarm import HostFloorAlarm
from tf_amp.optimizers._legacy_scale_args import legacy_loss_scale
from tf_amp.optimizers._tf_keras_config import TfKerasConfig
from tf_amp.optimizers._tf_keras_state import TfKerasScaleState, create_state_variables
from tf_amp.optimizers._unscaled_marks import UnscaledMarks, current_graph


def _warn_never_scaled() -> None:
    warnings.warn(
        "LossScaleOptimizer.apply_gradients() got gradients of a loss that was not scaled with "
        "get_scaled_loss() in this step, and not unscaled with get_unscaled_gradients(); they "
        "are divided by the loss scale as if the loss had been scaled. The tf.keras 2.x recipe "
        "is: `scaled = opt.get_scaled_loss(loss)` under the tape, then "
        "`opt.apply_gradients(zip(opt.get_unscaled_gradients(tape.gradient(scaled, vars)), "
        "vars))`.",
        UserWarning,
        stacklevel=4,
    )


def _check_inner(inner: Any, legacy: bool) -> None:
    _common.check_not_wrapped(inner)
    if upstream.is_tf_keras_loss_scale_optimizer(inner):
        raise ValueError(
            "the optimizer is already a tf_keras.mixed_precision.LossScaleOptimizer, which scales "
            "the loss itself; pass its `inner_optimizer` to tf_amp instead so the loss is scaled "
            "once"
        )
    current, legacy_base = upstream.optimizer_bases()
    expected = legacy_base if legacy else current
    if not isinstance(inner, expected):
        raise TypeError(
            f"{'TfKerasLegacyLossScaleOptimizer' if legacy else 'TfKerasLossScaleOptimizer'} "
            f"wraps a {expected.__module__}.{expected.__name__}, got {type(inner).__name__}; "
            "tf_amp.LossScaleOptimizer(opt) picks the right wrapper for any supported optimizer"
        )


class TfKerasLossScaling(TfKerasScaleState, TfKerasConfig):
    """What both tf_keras wrappers share: state, the custom-loop API, apply-or-skip, config.

    A mixin placed before tf_keras's ``LossScaleOptimizer`` classes, whose delegation to the
    inner optimizer (hyperparameters, slots, ``iterations``, ``variables``, checkpoint
    dependencies) it keeps, and whose scaling logic it replaces everywhere.
    """

    _tf_amp_loss_scale_wrapper = True
    _legacy = False
    # Set on the wrapper the environment activation puts around a script's own optimizer:
    # files that tf_keras's save_model writes then hold that optimizer (the activation swaps
    # it in for the save), and .h5 weights load into it, so files stay interchangeable with
    # float32 runs and with a process that has no tf_amp.
    saves_as_inner = False

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Passes the weights to the inner optimizer where they are its weights: a
        ``saves_as_inner`` wrapper's ``.h5`` file (float32, or saved under the environment)
        holds that optimizer's, and a current wrapper's ``variables`` are its inner
        optimizer's, so its ``.h5`` file holds them too. Loaded into the wrapper itself,
        tf_keras found the wrapper unbuilt (its inner optimizer was built) and dropped the
        state with "Error in loading the saved optimizer state", as it does for tf_keras's own
        wrapper. A legacy wrapper's own ``set_weights`` already takes them."""
        if self.saves_as_inner or not self._legacy:
            self._optimizer.set_weights(weights)
        else:
            super().set_weights(weights)

    def _init_scaling(
        self,
        inner: Any,
        loss_scale: Any,
        enabled: bool,
        floor_warning_skips: int,
        max_consecutive_skips: int | None,
        name: str | None,
        kwargs: dict[str, Any],
    ) -> None:
        _check_inner(inner, self._legacy)
        # loss_scale, or tf.keras 2.x's dynamic= / initial_scale= / dynamic_growth_steps=
        policy = loss_scale_lib.get(legacy_loss_scale(loss_scale, kwargs))
        if kwargs:
            raise TypeError(f"LossScaleOptimizer got unexpected arguments: {sorted(kwargs)}")
        floor_warning_skips, max_consecutive_skips = _common.checked_skip_limits(
            floor_warning_skips, max_consecutive_skips
        )
        # Set with object.__setattr__: tf_keras's __setattr__ would track lists as checkpoint
        # dependencies, which the delegation below would hang on the inner optimizer.
        def put(attr: str, value: Any) -> None:
            object.__setattr__(self, attr, value)

        put("_optimizer", inner)
        inner._is_wrapped_by_loss_scale_optimizer = True  # tf_keras's own wrapper then refuses it
        _common.mark_wrapped(inner, self)
        upstream_tf.DelegatingTrackableMixin.__init__(self, inner)
        put("_policy", policy)
        put("enabled", bool(enabled))
        put("floor_warning_skips", floor_warning_skips)
        put("max_consecutive_skips", max_consecutive_skips)
        put("_tf_amp_name", name or "LossScaleOptimizer")
        put("_unscaled_marks", UnscaledMarks())
        put("_loss_has_been_scaled", False)
        put("_gradients_have_been_unscaled", False)
        # state exists before the first step: restores land at once
        state_vars = create_state_variables(policy)
        put("_state_vars", state_vars)
        put("_host_floor_alarm", HostFloorAlarm())
        put("_state_checkpoint", StateTrackable(
            state_vars, self._host_floor_alarm.events.counts, names=TF_STATE_NAMES
        ))
        # Delegated: the entry hangs on the inner optimizer, where tf_keras's wrapper puts it.
        self._track_trackable(self._state_checkpoint, "loss_scale", overwrite=True)

    # ------------------------------------------------------------- custom-loop API
    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * scale`` (in float32 for 16-bit losses); a callable gives a callable."""
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        if not self.enabled:
            return loss
        self._unscaled_marks.new_step()  # a new scaled loss: earlier unscales are not this step's
        state = LossScaleState(*(tf.convert_to_tensor(v) for v in self._state_vars))
        return _scaled_losses.mark(self._policy.scale(loss, state))

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Divides gradients by the scale with the fused op; ``apply_gradients`` then only
        checks them (or tensors derived from them, e.g. clipped) and does not divide again.
        Calling it twice before ``apply_gradients`` is an error."""
        if not self.enabled:
            return list(grads)
        if self._unscaled_marks.find()[1] is not None:
            raise RuntimeError(
                "get_unscaled_gradients() was already called since the last apply_gradients(); "
                "gradients would be unscaled twice"
            )
        grads = list(grads)
        unscaled, _ = unscale_and_check_finite(grads, self.loss_scale)
        self._unscaled_marks.open(grads, unscaled)
        return unscaled

    def _scaled_grads_and_vars(
        self, loss: Any, var_list: Any, tape: Any, grad_loss: Any = None
    ) -> list[tuple[Any, Any]]:
        """Gradients of the scaled loss, still scaled (``apply_gradients`` unscales them)."""
        tape = tf.GradientTape() if tape is None else tape
        with tape:
            scaled = self.get_scaled_loss(loss)
        if self._legacy:
            return self._optimizer._compute_gradients(  # noqa: SLF001 - tf_keras's own split
                scaled, var_list, grad_loss, tape=tape
            )
        return self._optimizer.compute_gradients(scaled, var_list, tape=tape)

    # ------------------------------------------------------------------------ apply
    def _build_inner(self, variables: list[Any]) -> None:
        with tf.init_scope():  # never inside the apply-or-skip branch
            if self._legacy:
                upstream.create_legacy_slots(self._optimizer, variables)
            else:
                self._optimizer.build(variables)

    def _apply_scaled(self, grads_and_vars: Iterable[Any], inner_kwargs: dict[str, Any]) -> Any:
        """Unscales (unless ``get_unscaled_gradients`` did), checks, and applies or skips.

        Returns the apply-or-skip cond's output (None on the ``merge_call`` path)."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        self._build_inner(variables)

        def inner_apply(grads: Any, wrapped: KeepWhole) -> Any:
            result = self._optimizer.apply_gradients(
                list(zip(grads, wrapped.value, strict=True)), **inner_kwargs
            )
            return result if isinstance(result, tf.Operation) else None

        if not self.enabled:
            return inner_apply(grads, KeepWhole(variables))
        if tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy():
            raise ValueError("apply_gradients() must be called in a replica context.")
        graph, mark = self._unscaled_marks.find()
        if not self._unscaled_marks.take_scaled() and mark is None:
            _warn_never_scaled()
        already = False
        if mark is not None:
            if graph is not None or current_graph() is None:
                self._unscaled_marks.close(graph)
            already = mark.classify(grads)
        scale = tf.convert_to_tensor(self._state_vars[0])
        unscaled, finite = unscale_and_check_finite(grads, tf.constant(1.0) if already else scale)
        done = _apply_or_skip.apply_if_finite(
            _apply_or_skip.all_replicas_finite(finite),
            inner_apply,
            unscaled,
            KeepWhole(variables),
            self._policy,
            self._state_vars,
            self.floor_warning_skips,
            self.max_consecutive_skips,
            events=self._host_floor_alarm.events,
        )
        with tf.control_dependencies([done] if done is not None else []):
            _summaries.write_summaries(self._state_vars[0], self._state_vars[2], self.iterations)
        return done
