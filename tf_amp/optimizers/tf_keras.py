"""Loss scaling for tf_keras (Keras 2) optimizers, current and legacy, with tf.keras 2.x's API.

Since TensorFlow 2.16, ``tf.keras`` is Keras 3 unless ``tf_keras`` is installed and
``TF_USE_LEGACY_KERAS=1`` is set; code bases that kept their Keras 2 models get here.
``tf_amp.LossScaleOptimizer(opt)`` returns, for

* a ``tf_keras.optimizers.*`` optimizer: :class:`TfKerasLossScaleOptimizer`;
* a ``tf_keras.optimizers.legacy.*`` one: :class:`TfKerasLegacyLossScaleOptimizer`.

Both are tf_keras optimizers of the inner optimizer's kind, and subclasses of tf_keras's own
``LossScaleOptimizer`` classes (see ``tf_amp._upstream.tf_keras`` for why), so ``compile``,
``fit``, ``model.save`` and ``tf.train.Checkpoint`` take them unchanged. Everything that decides
a step is tf_amp's, as for Keras 3: one fused native op unscales and checks all gradients, the
flag is ANDed over replicas, a ``tf.cond`` applies the inner optimizer or skips the step, and a
skipped step leaves weights, slots and ``iterations`` untouched (tf_keras's own wrapper counted
skipped steps in ``iterations``).

Typical use (the tf.keras 2.x custom loop)::

    opt = tf_amp.LossScaleOptimizer(tf_keras.optimizers.Adam(1e-3))
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))    # skipped on inf/nan

``minimize`` (what tf_keras's ``Model.train_step`` calls) scales the loss and applies with a
single fused unscale-and-check. Checkpoints keep tf_keras's layout: the inner optimizer's own
names plus a ``loss_scale`` entry (``current_loss_scale``, ``good_steps``, ... ), so a checkpoint
of tf_keras's own ``LossScaleOptimizer`` restores its scale here, and checkpoints move between
the wrapper and the plain optimizer (``expect_partial()`` for the scale one way).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from tf_amp import loss_scale as loss_scale_lib
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp._upstream import tf_keras as upstream
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.ops import unscale_and_check_finite
from tf_amp.optimizers import _apply_or_skip, _common, _summaries
from tf_amp.optimizers._legacy_scale_args import LEGACY_SCALE_ARGS, legacy_loss_scale
from tf_amp.optimizers._unscaled_marks import UnscaledMarks, current_graph
from tf_amp.runtime import _state

_LOSS_SCALE_BASE, _LSO_V3, _LSO_LEGACY = upstream.loss_scale_optimizer_classes()
_OPTIMIZER, _LEGACY_OPTIMIZER = upstream.optimizer_bases()

# Checkpoint names of the state, in LossScaleState order. The first two are the names tf_keras's
# own dynamic loss scale uses, so its checkpoints restore the scale and counter here.
_CHECKPOINT_NAMES = ("current_loss_scale", "good_steps", "skipped_steps", "consecutive_skips",
                     "floor_skips")


class _StateTrackable(upstream_tf.AutoTrackable):
    """The loss-scale variables as the ``loss_scale`` checkpoint entry, in tf_keras's names."""

    def __init__(self, variables: Sequence[tf.Variable]) -> None:
        super().__init__()
        for name, variable in zip(_CHECKPOINT_NAMES, variables, strict=True):
            setattr(self, name, variable)


class KeepWhole:
    """Carries the variable list through ``merge_call`` / ``call_for_each_replica`` untouched.

    A strategy hands each replica its own component of a mirrored *variable* passed as an
    argument; the inner optimizer must get the mirrored variables themselves (tf_keras's wrapper
    does the same with its ``_UnwrapPreventer``).
    """

    def __init__(self, value: list[Any]) -> None:
        self.value = value


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


class _TfKerasLossScaling:
    """What both tf_keras wrappers share: state, the custom-loop API, apply-or-skip, config.

    A mixin placed before tf_keras's ``LossScaleOptimizer`` classes, whose delegation to the
    inner optimizer (hyperparameters, slots, ``iterations``, ``variables``, checkpoint
    dependencies) it keeps, and whose scaling logic it replaces everywhere.
    """

    _tf_amp_loss_scale_wrapper = True
    _legacy = False

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
        if max_consecutive_skips is not None and max_consecutive_skips < 1:
            raise ValueError(
                f"max_consecutive_skips must be None or >= 1, got {max_consecutive_skips}"
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
        put("floor_warning_skips", int(floor_warning_skips))
        put("max_consecutive_skips", max_consecutive_skips)
        put("_tf_amp_name", name or "LossScaleOptimizer")
        put("_unscaled_marks", UnscaledMarks())
        put("_loss_has_been_scaled", False)
        put("_gradients_have_been_unscaled", False)
        with tf.init_scope():  # state exists before the first step: restores land at once
            initial = policy.initial_state()
            state_vars = [
                tf.Variable(
                    value,
                    name=f"loss_scale_{field}",
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                    # every replica computes the same state (the finite flag is ANDed)
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )
                for field, value in zip(LossScaleState._fields, initial, strict=True)
            ]
        put("_state_vars", state_vars)
        put("_state_checkpoint", _StateTrackable(state_vars))
        # Delegated: the entry hangs on the inner optimizer, where tf_keras's wrapper puts it.
        self._track_trackable(self._state_checkpoint, "loss_scale", overwrite=True)

    # ------------------------------------------------------------------------ state
    @property
    def name(self) -> str:
        return self._tf_amp_name

    @property
    def loss_scale_policy(self) -> LossScale:
        """The ``tf_amp.LossScale`` (static or dynamic) that moves the scale."""
        return self._policy

    @property
    def dynamic(self) -> bool:
        return self._policy.dynamic

    @property
    def initial_scale(self) -> float:
        return self._policy.initial_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        return getattr(self._policy, "growth_interval", None)

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale (float32 scalar); 1 when disabled."""
        if not self.enabled:
            return tf.constant(1.0)
        return tf.convert_to_tensor(self._state_vars[0])

    def set_loss_scale(self, value: float) -> None:
        """Sets the current scale, e.g. to change a static scale mid-training."""
        self._state_vars[0].assign(float(value))

    @property
    def dynamic_counter(self) -> tf.Tensor | None:
        """Consecutive finite steps since the scale last changed; None for a static scale."""
        return tf.convert_to_tensor(self._state_vars[1]) if self.dynamic else None

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Total number of skipped (non-finite) steps."""
        return tf.convert_to_tensor(self._state_vars[2])

    def loss_scale_metrics(self) -> dict[str, tf.Tensor]:
        """``{"loss_scale": ..., "skipped_steps": ...}`` for logs and TensorBoard."""
        return {
            "loss_scale": self.loss_scale,
            "skipped_steps": tf.cast(self.skipped_steps, tf.float32),
        }

    # ------------------------------------------------------------- custom-loop API
    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss * scale`` (in float32 for 16-bit losses); a callable gives a callable."""
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        if not self.enabled:
            return loss
        self._unscaled_marks.new_step()  # a new scaled loss: earlier unscales are not this step's
        state = LossScaleState(*(tf.convert_to_tensor(v) for v in self._state_vars))
        return self._policy.scale(loss, state)

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
        )
        with tf.control_dependencies([done] if done is not None else []):
            _summaries.write_summaries(self._state_vars[0], self._state_vars[2], self.iterations)
        return done

    # ---------------------------------------------------------------- serialization
    def get_config(self) -> dict[str, Any]:
        policy = self._policy
        return {
            "name": self.name,
            "inner_optimizer": upstream.serialize_optimizer(self._optimizer),
            "loss_scale": loss_scale_lib.serialize(policy),
            "enabled": self.enabled,
            "floor_warning_skips": self.floor_warning_skips,
            "max_consecutive_skips": self.max_consecutive_skips,
            "graph_rewrite": _state.optimizer_wants_rewrite(self),
            # tf_keras's own keys, read-only copies (from_config prefers loss_scale)
            "dynamic": policy.dynamic,
            "initial_scale": policy.initial_scale,
            "dynamic_growth_steps": getattr(policy, "growth_interval", None),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
        """From tf_amp's config or tf_keras's own ``LossScaleOptimizer`` config."""
        config = dict(config)
        inner = config.pop("inner_optimizer")
        if isinstance(inner, dict):
            inner = upstream.deserialize_optimizer(inner, custom_objects, legacy=cls._legacy)
        if "loss_scale" in config:
            for key in LEGACY_SCALE_ARGS:
                config.pop(key, None)
            config["loss_scale"] = loss_scale_lib.deserialize(config["loss_scale"])
        graph_rewrite = config.pop("graph_rewrite", False)
        optimizer = cls(inner, **config)
        if graph_rewrite:
            from tf_amp.runtime.rewrite_switch import mark_for_rewrite

            mark_for_rewrite(optimizer)
        return optimizer


def _check_inner(inner: Any, legacy: bool) -> None:
    _common.check_not_wrapped(inner)
    if upstream.is_tf_keras_loss_scale_optimizer(inner):
        raise ValueError(
            "the optimizer is already a tf_keras.mixed_precision.LossScaleOptimizer, which scales "
            "the loss itself; pass its `inner_optimizer` to tf_amp instead so the loss is scaled "
            "once"
        )
    expected = _LEGACY_OPTIMIZER if legacy else _OPTIMIZER
    if not isinstance(inner, expected):
        raise TypeError(
            f"{'TfKerasLegacyLossScaleOptimizer' if legacy else 'TfKerasLossScaleOptimizer'} "
            f"wraps a {expected.__module__}.{expected.__name__}, got {type(inner).__name__}; "
            "tf_amp.LossScaleOptimizer(opt) picks the right wrapper for any supported optimizer"
        )


class TfKerasLossScaleOptimizer(_TfKerasLossScaling, _LSO_V3):
    """Loss scaling around a ``tf_keras.optimizers.Optimizer`` (``tf_keras.optimizers.Adam``...).

    Args:
      inner_optimizer: the tf_keras optimizer that applies the unscaled gradients (clipping,
        weight decay and EMA stay on it and act on unscaled gradients).
      loss_scale: ``"dynamic"`` (default), a number (static) or a ``tf_amp.LossScale``; or
        tf_keras's ``dynamic=``, ``initial_scale=``, ``dynamic_growth_steps=``.
      enabled: ``False`` makes the wrapper a pass-through (scale 1, no check, no skipping).
      floor_warning_skips: warn after this many skips in a row at the floor (0: never).
      max_consecutive_skips: raise after this many consecutive skips (None: never).
      name: the wrapper's name.
    """

    @upstream_tf.no_automatic_dependency_tracking
    def __init__(
        self,
        inner_optimizer: Any,
        loss_scale: Any = "dynamic",
        enabled: bool = True,
        floor_warning_skips: int = _common.FLOOR_WARNING_SKIPS,
        max_consecutive_skips: int | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._init_scaling(
            inner_optimizer, loss_scale, enabled, floor_warning_skips, max_consecutive_skips,
            name, kwargs,
        )

    def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> Any:
        """Scales ``loss``, and applies its gradients with one fused unscale-and-check."""
        return self.apply_gradients(self._scaled_grads_and_vars(loss, var_list, tape))

    def apply_gradients(
        self,
        grads_and_vars: Iterable[Any],
        name: str | None = None,
        skip_gradients_aggregation: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Applies the gradients if all are finite (on every replica), else skips the step."""
        aggregate = kwargs.pop("experimental_aggregate_gradients", True)
        inner_kwargs = {
            "name": name,
            "skip_gradients_aggregation": skip_gradients_aggregation or not aggregate,
        }
        self._apply_scaled(grads_and_vars, inner_kwargs)
        return self.iterations


class TfKerasLegacyLossScaleOptimizer(_TfKerasLossScaling, _LSO_LEGACY):
    """Loss scaling around a ``tf_keras.optimizers.legacy.Optimizer`` (``OptimizerV2``).

    Arguments as for :class:`TfKerasLossScaleOptimizer`. Hyperparameters (``learning_rate``,
    ``beta_1``...) read and set through the wrapper act on the inner optimizer, as in tf.keras
    2.x.
    """

    _legacy = True

    def __init__(
        self,
        inner_optimizer: Any,
        loss_scale: Any = "dynamic",
        enabled: bool = True,
        floor_warning_skips: int = _common.FLOOR_WARNING_SKIPS,
        max_consecutive_skips: int | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._init_scaling(
            inner_optimizer, loss_scale, enabled, floor_warning_skips, max_consecutive_skips,
            name, kwargs,
        )

    def minimize(
        self, loss: Any, var_list: Any, grad_loss: Any = None, name: str | None = None,
        tape: Any = None,
    ) -> Any:
        """Scales ``loss``, and applies its gradients with one fused unscale-and-check."""
        grads_and_vars = self._scaled_grads_and_vars(loss, var_list, tape, grad_loss)
        return self.apply_gradients(grads_and_vars, name=name)

    def apply_gradients(
        self,
        grads_and_vars: Iterable[Any],
        name: str | None = None,
        experimental_aggregate_gradients: bool = True,
    ) -> Any:
        """Applies the gradients if all are finite (on every replica), else skips the step."""
        done = self._apply_scaled(
            grads_and_vars,
            {"name": name, "experimental_aggregate_gradients": experimental_aggregate_gradients},
        )
        return tf.group(*([done] if done is not None else []))


TfKerasLossScaleOptimizer = upstream.register_serializable(TfKerasLossScaleOptimizer)
TfKerasLegacyLossScaleOptimizer = upstream.register_serializable(TfKerasLegacyLossScaleOptimizer)


def wrap(inner: Any, loss_scale: Any = "dynamic", **kwargs: Any) -> Any:
    """The tf_amp wrapper for a tf_keras optimizer (legacy or current)."""
    cls = (
        TfKerasLegacyLossScaleOptimizer
        if isinstance(inner, _LEGACY_OPTIMIZER)
        else TfKerasLossScaleOptimizer
    )
    return cls(inner, loss_scale=loss_scale, **kwargs)
