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

import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src import backend as keras_backend
from keras.src.saving.keras_saveable import KerasSaveable
from keras.src.utils import tracking

from tf_amp import loss_scale as loss_scale_lib
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.ops import unscale_and_check_finite
from tf_amp.optimizers import _checkpoint_layout, _common, _keras_config
from tf_amp.optimizers._unscaled_marks import UnscaledMarks, current_graph

# Base-optimizer arguments that belong on the inner optimizer, not on the wrapper.
_INNER_ONLY_ARGS = {
    "learning_rate": None,
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}

_STATE_FIELDS = LossScaleState._fields


class _StateEntry(KerasSaveable):
    """The loss-scale state variables as a .keras file entry of their own.

    Keras saves every saveable attribute of the optimizer under its own path; a file loaded by
    a plain optimizer ignores this one, and a float32 file (no entry) leaves the state as built.
    """

    def __init__(self, wrapper: Any) -> None:
        self._wrapper_ref = weakref.ref(wrapper)

    def _obj_type(self) -> str:
        return "Optimizer"  # a type Keras's saving knows; nothing here is walked further

    def _state_vars(self) -> list[Any]:
        wrapper = self._wrapper_ref()
        return list(getattr(wrapper, "_state_vars", [])) if wrapper is not None else []

    def save_own_variables(self, store: Any) -> None:
        for i, variable in enumerate(self._state_vars()):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        variables = self._state_vars()
        if len(store.keys()) == len(variables):
            for i, variable in enumerate(variables):
                variable.assign(store[str(i)])


def _legacy_loss_scale(loss_scale: Any, kwargs: dict[str, Any]) -> Any:
    """Accepts the argument names of ``tf.keras.mixed_precision.LossScaleOptimizer`` (TF2) and
    ``keras.optimizers.LossScaleOptimizer``: ``dynamic``, ``initial_scale``,
    ``dynamic_growth_steps``, so code written for them can switch by changing the class."""
    legacy = {
        k: kwargs.pop(k)
        for k in ("dynamic", "initial_scale", "dynamic_growth_steps")
        if k in kwargs
    }
    if not legacy:
        return loss_scale
    if not isinstance(legacy.get("dynamic", True), bool):
        raise TypeError(
            f"dynamic must be True or False, got {legacy['dynamic']!r}; for a dynamic scale "
            "pass dynamic=True (or loss_scale=\"dynamic\"), for a fixed one dynamic=False "
            "with initial_scale=..."
        )
    if loss_scale != "dynamic":
        raise ValueError(
            f"pass either loss_scale or {sorted(legacy)}, not both (got loss_scale={loss_scale!r})"
        )
    if legacy.get("dynamic", True):
        return loss_scale_lib.DynamicLossScale(
            initial_scale=_or_default(legacy.get("initial_scale"), 2.0**15),
            growth_interval=_or_default(legacy.get("dynamic_growth_steps"), 2000),
        )
    if legacy.get("dynamic_growth_steps") is not None:
        raise ValueError("dynamic_growth_steps has no meaning with dynamic=False")
    return loss_scale_lib.StaticLossScale(_or_default(legacy.get("initial_scale"), 2.0**15))


def _warn_unscaled_never_scaled() -> None:
    """tf.keras 2.x's warning, kept a warning (not an error) on purpose.

    ``apply`` treats gradients as gradients of ``scale_loss(loss)``, Keras 3's contract, and
    divides them by the scale. Gradients of a loss that never went through ``scale_loss``
    nor ``get_unscaled_gradients`` in this step are most likely the TF2 guide's recipe with a
    call forgotten, and would be divided by 32768. But the loss may also have been scaled where
    the wrapper cannot see it (``loss * opt.loss_scale``, or in another ``tf.function`` than
    the one applying, which Keras 3's own tests do), and there the division is right: an error
    would break correct programs the wrapper cannot tell apart, a warning costs a log line.
    """
    warnings.warn(
        "LossScaleOptimizer.apply()/apply_gradients() got gradients of a loss that was not "
        "scaled with scale_loss()/get_scaled_loss() in this step, and not unscaled with "
        "get_unscaled_gradients(); they are divided by the loss scale as if the loss had been "
        "scaled. If they are true gradients, scale the loss: "
        "`with tape: loss = opt.scale_loss(loss)` then `opt.apply(tape.gradient(loss, vars), "
        "vars)` (or get_scaled_loss() + get_unscaled_gradients(), the tf.keras 2.x recipe).",
        UserWarning,
        stacklevel=3,
    )


def _or_default(value: Any, default: Any) -> Any:
    """TF2's signature defaults these arguments to None, meaning "the default"."""
    return default if value is None else value


@keras.saving.register_keras_serializable(package="tf_amp")
class KerasLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
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
        _common.check_not_wrapped(inner_optimizer)
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"KerasLossScaleOptimizer wraps a keras.optimizers.Optimizer, got "
                f"{type(inner_optimizer).__name__}; {_common.SUPPORTED_MESSAGE}"
            )
        loss_scale = _legacy_loss_scale(loss_scale, kwargs)
        for arg, default in _INNER_ONLY_ARGS.items():
            if arg in kwargs and kwargs.pop(arg) != default:
                raise ValueError(
                    f"LossScaleOptimizer does not take `{arg}`; set `{arg}` on the inner "
                    "optimizer, which receives the unscaled gradients"
                )
        if kwargs:
            raise TypeError(f"LossScaleOptimizer got unexpected arguments: {sorted(kwargs)}")
        if inner_optimizer.loss_scale_factor is not None:
            raise ValueError(
                f"the inner optimizer has loss_scale_factor={inner_optimizer.loss_scale_factor}, "
                "which would scale the loss a second time; create it without "
                "loss_scale_factor and pass loss_scale="
                f"{inner_optimizer.loss_scale_factor} to LossScaleOptimizer instead"
            )
        if max_consecutive_skips is not None and max_consecutive_skips < 1:
            raise ValueError(
                f"max_consecutive_skips must be None or >= 1, got {max_consecutive_skips}"
            )
        # Skip keras.optimizers.LossScaleOptimizer.__init__ (its own scale and arguments).
        super(keras.optimizers.LossScaleOptimizer, self).__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        _common.mark_wrapped(inner_optimizer, self)
        self._policy = loss_scale_lib.get(loss_scale)
        self.enabled = bool(enabled)
        self.floor_warning_skips = int(floor_warning_skips)
        self.max_consecutive_skips = max_consecutive_skips
        self._unscaled_marks = UnscaledMarks()
        self._create_state()

    # ----------------------------------------------------------------------------- state
    @tracking.no_automatic_dependency_tracking
    def _create_state(self) -> None:
        """Creates the loss-scale variables now, as Keras creates ``iterations`` in __init__.

        They depend on no model variable, and existing before ``build`` is what makes them
        readable before the first step and what lets ``tf.train.Checkpoint.restore`` into a
        fresh wrapper land at once, so the first ``scale_loss`` already uses the restored scale.
        """
        initial = [self._policy.initial_scale] + [0] * (len(_STATE_FIELDS) - 1)
        self._state_vars = [
            self.add_variable(
                shape=(),
                dtype="float32" if field == "scale" else "int64",
                initializer=keras.initializers.Constant(float(value)),
                aggregation="only_first_replica",
                name=f"loss_scale_{field}",
            )
            for field, value in zip(_STATE_FIELDS, initial, strict=True)
        ]
        self._state_checkpoint = _checkpoint_layout.StateTrackable(self._state_vars)

    @tracking.no_automatic_dependency_tracking
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

    # tf.train.Checkpoint and SavedModel see the inner optimizer's layout plus one child for
    # the loss-scale state, so checkpoints move between the wrapper and a plain optimizer.
    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict:
        return _checkpoint_layout.children(self, save_type, **kwargs)

    def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
        if cached_dependencies is None:  # the wrapper tracking its own attributes
            return super()._lookup_dependency(name)
        return cached_dependencies.get(name)  # a restore, given the children above

    @property
    def _deferred_dependencies(self) -> dict:
        # Entries restored before the inner optimizer created them wait on the inner one,
        # which is the object that creates them (Keras's base __init__ asks before it exists).
        inner = self.__dict__.get("inner_optimizer")
        owner = super() if inner is None else inner
        return owner._deferred_dependencies  # noqa: SLF001

    # Set on the wrapper the environment activation puts around a script's own optimizer: its
    # .keras files then hold that optimizer's variables laid out as the optimizer itself saves
    # them, so files stay interchangeable with float32 runs both ways; the loss-scale state
    # goes to an entry of its own (``loss_scale_state``) that a plain optimizer never reads.
    saves_as_inner = False

    @property
    def loss_scale_state(self) -> Any:
        """The state's entry in a .keras file of a ``saves_as_inner`` wrapper, else None."""
        if not self.saves_as_inner:
            return None
        entry = self.__dict__.get("_tf_amp_state_entry")
        if entry is None:
            entry = _StateEntry(self)
            object.__setattr__(self, "_tf_amp_state_entry", entry)
        return entry

    def save_own_variables(self, store: Any) -> None:
        if self.saves_as_inner:
            self.inner_optimizer.save_own_variables(store)
        else:
            super().save_own_variables(store)

    def load_own_variables(self, store: Any) -> None:
        inner = self.inner_optimizer
        if self.saves_as_inner and len(store.keys()) == len(inner.variables):
            inner.load_own_variables(store)
            # Keras then visits inner_optimizer as a child of its own: in a float32 file that
            # entry is empty, and the inner optimizer would warn that it skipped loading the
            # state it was just given.
            load_inner = type(inner).load_own_variables

            def load_unless_empty(store: Any) -> None:
                if len(store.keys()):
                    load_inner(inner, store)

            inner.load_own_variables = load_unless_empty
        else:
            super().load_own_variables(store)

    def set_weights(self, weights: Sequence[Any]) -> None:
        """A ``saves_as_inner`` wrapper passes the weights to its inner optimizer: a ``.h5``
        file, float32 or saved under the environment, holds the inner optimizer's weights, and
        it loads them exactly as the plain optimizer would (Keras's ``set_weights``)."""
        if self.saves_as_inner:
            self.inner_optimizer.set_weights(weights)
        else:
            super().set_weights(weights)

    def _state(self) -> LossScaleState:
        return LossScaleState(*(v.value for v in self._state_vars))

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
        """The current scale (float32 scalar); 1 when disabled. Assign to set it (apex-style)."""
        if not self.enabled:
            return tf.constant(1.0)
        return tf.convert_to_tensor(self._state_vars[0].value)

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        self.set_loss_scale(value)

    def set_loss_scale(self, value: float) -> None:
        """Sets the current scale, e.g. to change a static scale mid-training."""
        self._state_vars[0].assign(float(value))

    @property
    def dynamic_counter(self) -> tf.Tensor | None:
        """Consecutive finite steps since the scale last changed; None for a static scale
        (as in Keras 3 and tf.keras, where only a dynamic scale has a counter)."""
        if not self.dynamic:
            return None
        return tf.convert_to_tensor(self._state_vars[1].value)

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Total number of skipped (non-finite) steps."""
        return tf.convert_to_tensor(self._state_vars[2].value)

    def loss_scale_metrics(self) -> dict[str, tf.Tensor]:
        """``{"loss_scale": ..., "skipped_steps": ...}`` for logs, progress bars, TensorBoard."""
        return {
            "loss_scale": self.loss_scale,
            "skipped_steps": tf.cast(
                self.skipped_steps, tf.float32
            ),
        }

    # ------------------------------------------------------------------- custom-loop API
    def scale_loss(self, loss: Any) -> Any:
        """``loss * scale`` (in float32 for 16-bit losses); Keras's ``fit`` calls this."""
        if callable(loss):
            return lambda: self.scale_loss(loss())
        if not self.enabled:
            return loss
        self._unscaled_marks.new_step()  # a new scaled loss: earlier unscales are not this step's
        state = self._state()
        return self._policy.scale(loss, state)

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
            with keras_backend.name_scope(self.name, caller=self):
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
            _warn_unscaled_never_scaled()
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
        finite = _common.all_replicas_finite(finite)

        done = _common.apply_if_finite(
            finite,
            self.inner_optimizer.apply,
            unscaled,
            trainable_variables,
            self._policy,
            state_vars,
            self.floor_warning_skips,
            self.max_consecutive_skips,
        )
        with tf.control_dependencies([done] if done is not None else []):
            _common.write_summaries(state_vars[0], state_vars[2], self.iterations)
        return None

    def apply_gradients(self, grads_and_vars: Any) -> Any:
        grads, variables = zip(*grads_and_vars, strict=True)
        self.apply(grads, variables)
        return self.iterations  # the inner optimizer's count, which skipped steps leave alone

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise NotImplementedError(
            "tf_amp's LossScaleOptimizer supports the TensorFlow backend only (stateful apply)"
        )

    # -------------------------------------------------------------------- delegation
    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    # ----------------------------------------------------------------- serialization
    def get_config(self) -> dict[str, Any]:
        graph_rewrite = bool(getattr(self, _common.GRAPH_REWRITE_ATTR, False))
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
        optimizer = cls(inner, loss_scale=policy, **config)
        if graph_rewrite:
            from tf_amp.enable import mark_for_rewrite  # on use: enable imports this module

            mark_for_rewrite(optimizer)
        return optimizer


def _forwarded(name: str) -> property:
    """An attribute of the inner optimizer, read and set through the wrapper (tf.keras 2.x
    forwarded these too): the inner optimizer is the one that clips, decays and averages."""

    def get(self: KerasLossScaleOptimizer) -> Any:
        inner = self.__dict__.get("inner_optimizer")
        return None if inner is None else getattr(inner, name)

    def set_(self: KerasLossScaleOptimizer, value: Any) -> None:
        inner = self.__dict__.get("inner_optimizer")
        if inner is not None:  # Keras's base __init__ sets its defaults before inner exists
            setattr(inner, name, value)

    return property(get, set_, doc=f"The inner optimizer's ``{name}``.")


FORWARDED_ATTRIBUTES = (
    "clipnorm",
    "global_clipnorm",
    "clipvalue",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "weight_decay",
    "gradient_accumulation_steps",
)
for _name in FORWARDED_ATTRIBUTES:
    setattr(KerasLossScaleOptimizer, _name, _forwarded(_name))


class LossScaleCallback(keras.callbacks.Callback):
    """Adds ``loss_scale`` and ``skipped_steps`` to the epoch logs of ``fit``.

    Place it before ``keras.callbacks.TensorBoard`` in the callback list and the two values are
    charted as ``epoch_loss_scale`` / ``epoch_skipped_steps``; they also land in ``History``.
    Reading the two scalars once per epoch is the only host sync it adds.
    """

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if logs is None or not hasattr(optimizer, "loss_scale_metrics"):
            return
        for key, value in optimizer.loss_scale_metrics().items():
            logs[key] = float(value)
