"""Loss scaling for ``tf.compat.v1.train`` optimizers, in a TF1 ``Session`` or a ``tf.function``.

The wrapper is itself a ``tf.compat.v1.train.Optimizer``: ``compute_gradients`` returns unscaled
gradients of the scaled loss, ``apply_gradients`` applies them under a ``tf.cond`` (a skipped
step does not touch weights, slots or ``global_step``), and the inherited ``minimize`` chains
the two. Its state variables are global variables, so the default ``tf.compat.v1.train.Saver``
and ``tf.train.Checkpoint`` save them.

Typical use::

    opt = tf_amp.LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3))
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from tf_amp import loss_scale as loss_scale_lib
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.loss_scale._base import checked_scale
from tf_amp.ops import unscale_and_check_finite
from tf_amp.optimizers import _apply_or_skip, _common, _summaries
from tf_amp.optimizers._checkpoint_layout import STATE_CHILD, TF_STATE_NAMES, StateTrackable

_V1Optimizer = tf.compat.v1.train.Optimizer
# Where earlier layouts put the inner optimizer: TensorFlow's MixedPrecisionLossScaleOptimizer,
# and this wrapper before it took the inner optimizer's layout.
_INNER_CHILDREN = frozenset({"base_optimizer", "inner_optimizer"})


class V1LossScaleOptimizer(_V1Optimizer):
    """Dynamic or static loss scaling around a ``tf.compat.v1.train.Optimizer``.

    Args: as for the Keras wrapper (``loss_scale``, ``enabled``, ``floor_warning_skips``,
    ``max_consecutive_skips``, ``name``).
    """

    _tf_amp_loss_scale_wrapper = True

    def __init__(
        self,
        inner_optimizer: _V1Optimizer,
        loss_scale: Any = "dynamic",
        enabled: bool = True,
        floor_warning_skips: int = _common.FLOOR_WARNING_SKIPS,
        max_consecutive_skips: int | None = None,
        name: str | None = None,
    ) -> None:
        _common.check_not_wrapped(inner_optimizer)
        if not isinstance(inner_optimizer, _V1Optimizer):
            raise TypeError(
                f"V1LossScaleOptimizer wraps a tf.compat.v1.train.Optimizer, got "
                f"{type(inner_optimizer).__name__}; {_common.SUPPORTED_MESSAGE}"
            )
        # Every argument is checked before the inner optimizer is marked as wrapped.
        policy = loss_scale_lib.get(loss_scale)
        skip_limits = _common.checked_skip_limits(floor_warning_skips, max_consecutive_skips)
        super().__init__(use_locking=False, name=name or f"LossScale{inner_optimizer.get_name()}")
        self._inner = inner_optimizer
        _common.mark_wrapped(inner_optimizer, self)
        self._policy = policy
        self.enabled = bool(enabled)
        self.floor_warning_skips, self.max_consecutive_skips = skip_limits
        self._state_vars: list[tf.Variable] | None = None
        self._state_graph: Any = None
        self._last_unscaled: tuple[list[Any], tf.Tensor] | None = None
        if tf.executing_eagerly():
            # Created now, under the caller's strategy scope, rather than inside a replica fn.
            self._ensure_state()

    @property
    def inner_optimizer(self) -> _V1Optimizer:
        return self._inner

    @property
    def loss_scale_policy(self) -> LossScale:
        return self._policy

    # ----------------------------------------------------------------------------- state
    def _ensure_state(self) -> list[tf.Variable]:
        """Creates the state variables once per graph (TF1) or once (eager / tf.function)."""
        with tf.init_scope():
            graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
            if self._state_vars is not None and self._state_graph is graph:
                return self._state_vars
            initial = [self._policy.initial_scale] + [0] * (len(LossScaleState._fields) - 1)
            variables = []
            with tf.name_scope(self.get_name()):
                for field, value in zip(LossScaleState._fields, initial, strict=True):
                    variables.append(
                        tf.Variable(
                            value,
                            dtype=tf.float32 if field == "scale" else tf.int64,
                            name=f"loss_scale_{field}",
                            trainable=False,
                            synchronization=tf.VariableSynchronization.ON_WRITE,
                            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                        )
                    )
            for field, variable in zip(LossScaleState._fields, variables, strict=True):
                # A restore made before the state existed (an earlier layout's names) lands.
                self._handle_deferred_dependencies(f"loss_scale_{field}", variable)
                # Saver restores a checkpoint without the state (runtime.auto_loss_scale_v1).
                variable._tf_amp_loss_scale_field = field
            if graph is not None:
                from tf_amp.optimizers._v1_saver import install_saver_patches

                install_saver_patches()
            self._state_vars, self._state_graph = variables, graph
            state = StateTrackable(variables, names=TF_STATE_NAMES)
            self._track_trackable(state, STATE_CHILD, overwrite=True)
        return variables

    # ------------------------------------------------------------------- checkpoints
    # The layout is the inner optimizer's (its variables under their names, its slots as the
    # slots of this node) plus one child, ``loss_scale``, holding the state under TF1's names
    # (``current_loss_scale``, ``good_steps``, then tf_amp's counters). So a checkpoint of the
    # plain optimizer restores into the wrapper (the scale starts afresh), the wrapper's into the
    # plain optimizer (``expect_partial()``), and one of TensorFlow's own
    # ``MixedPrecisionLossScaleOptimizer`` (inner under ``base_optimizer``) into the wrapper,
    # its scale and counter included. The wrapper's earlier layout (inner under
    # ``inner_optimizer``, the state as ``loss_scale_<field>``) still restores.
    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        found = dict(self._inner._trackable_children(save_type, **kwargs))  # noqa: SLF001
        found.update(super()._trackable_children(save_type, **kwargs))
        return found

    def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
        if name in _INNER_CHILDREN:
            return self._inner
        if name.startswith("loss_scale_") and self._state_vars is not None:
            field = name[len("loss_scale_"):]
            if field in LossScaleState._fields:
                return self._state_vars[LossScaleState._fields.index(field)]
        own = super()._lookup_dependency(name, cached_dependencies)
        if own is not None:
            return own
        return self._inner._lookup_dependency(name, cached_dependencies)  # noqa: SLF001

    @property
    def _deferred_dependencies(self) -> dict[str, Any]:
        # One table for both: a child the inner optimizer makes later (Adam's beta1_power at the
        # first minimize) finds the restore waiting for it there.
        self._inner._maybe_initialize_trackable()  # noqa: SLF001
        return self._inner._deferred_dependencies  # noqa: SLF001

    def _create_or_restore_slot_variable(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner._create_or_restore_slot_variable(*args, **kwargs)  # noqa: SLF001

    def _state(self) -> LossScaleState:
        return LossScaleState(*(tf.convert_to_tensor(v) for v in self._ensure_state()))

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale (a tensor in graph mode); 1 when disabled."""
        if not self.enabled:
            return tf.constant(1.0)
        return tf.convert_to_tensor(self._ensure_state()[0])

    def set_loss_scale(self, value: float) -> Any:
        """Sets the current scale (returns the assign op in graph mode)."""
        return self._ensure_state()[0].assign(checked_scale(value, "the loss scale"))

    @property
    def skipped_steps(self) -> tf.Tensor:
        return tf.convert_to_tensor(self._ensure_state()[2])

    @property
    def dynamic_counter(self) -> tf.Tensor | None:
        """Consecutive finite steps since the scale last changed; None for a static scale (as
        the Keras wrappers say it)."""
        return tf.convert_to_tensor(self._ensure_state()[1]) if self._policy.dynamic else None

    def loss_scale_metrics(self) -> dict[str, tf.Tensor]:
        return {
            "loss_scale": self.loss_scale,
            "skipped_steps": tf.cast(self.skipped_steps, tf.float32),
        }

    def variables(self) -> list[tf.Variable]:
        state = list(self._ensure_state())
        # Under the environment the inner optimizer's variables() lists this state too.
        return state + [v for v in self._inner.variables() if not any(v is s for s in state)]

    def get_slot(self, var: Any, name: str) -> Any:
        return self._inner.get_slot(var, name)

    def get_slot_names(self) -> list[str]:
        """The inner optimizer's: a checkpoint saves them as this node's slots, where a
        plain optimizer's checkpoint has them."""
        return self._inner.get_slot_names()

    # ------------------------------------------------------------------------ gradients
    def get_scaled_loss(self, loss: Any) -> Any:
        if callable(loss):
            return lambda: self.get_scaled_loss(loss())
        if not self.enabled:
            return loss
        return self._policy.scale(loss, self._state())

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Divides gradients of a ``get_scaled_loss`` loss by the scale (one fused op).

        ``apply_gradients`` given exactly these tensors reuses their finite flag.
        """
        if not self.enabled:
            return list(grads)
        unscaled, finite = unscale_and_check_finite(list(grads), self._state().scale)
        self._last_unscaled = (unscaled, finite)
        return unscaled

    def compute_gradients(
        self,
        loss: Any,
        var_list: Sequence[Any] | None = None,
        gate_gradients: int = _V1Optimizer.GATE_OP,
        aggregation_method: Any = None,
        colocate_gradients_with_ops: bool = False,
        grad_loss: Any = None,
    ) -> list[tuple[Any, Any]]:
        """Gradients of ``loss * scale``, divided by the scale (one fused op for all)."""
        return self.scaled_gradients(
            self._inner.compute_gradients,
            loss,
            var_list=var_list,
            gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops,
            grad_loss=grad_loss,
        )

    def scaled_gradients(
        self, compute_gradients: Callable[..., Any], loss: Any, **kwargs: Any
    ) -> list[tuple[Any, Any]]:
        """``compute_gradients(loss * scale, **kwargs)``, divided by the scale (one fused op).

        ``compute_gradients`` is the inner optimizer's, or (the environment activation, for a
        subclass that post-processes gradients in its own ``compute_gradients``) the base
        class's method that override reaches, so the override sees true gradients.
        """
        if not self.enabled:
            return compute_gradients(loss, **kwargs)
        scale = self._state().scale
        scaled: Any
        if callable(loss):
            scaled = _scaled_callable(self._policy, loss, scale)
        else:
            scaled = self._policy.scale(loss, _with_scale(scale))
        # By keyword, as TensorFlow's own minimize calls it: a subclass's override may take
        # only (loss, var_list=None, **kwargs).
        grads_and_vars = compute_gradients(scaled, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        unscaled, finite = unscale_and_check_finite(grads, scale)
        self._last_unscaled = (unscaled, finite)
        return list(zip(unscaled, [v for _, v in grads_and_vars], strict=True))

    def _finite_flag(self, grads: list[Any]) -> tf.Tensor:
        """Reuses the flag from ``compute_gradients`` when handed back the very same tensors.

        Otherwise (gradients clipped or computed elsewhere in between) checks them again, on the
        fused op with scale 1, so what is checked is what is applied.
        """
        cached = self._last_unscaled
        self._last_unscaled = None
        if (
            cached is not None
            and len(cached[0]) == len(grads)
            and all(a is b for a, b in zip(cached[0], grads, strict=True))
        ):
            return cached[1]
        return unscale_and_check_finite(grads, tf.constant(1.0))[1]

    def apply_gradients(
        self, grads_and_vars: Any, global_step: Any = None, name: str | None = None
    ) -> Any:
        """Applies unscaled gradients if all (on all replicas) are finite; moves the scale."""
        if not self.enabled:
            return self._inner.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        if tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy():
            raise ValueError("apply_gradients() must be called in a replica context.")
        grads_and_vars = tuple(grads_and_vars)
        self._ensure_state()
        finite = self._finite_flag([g for g, _ in grads_and_vars])
        finite = _apply_or_skip.all_replicas_finite(finite)
        return tf.distribute.get_replica_context().merge_call(
            self._cross_replica_apply, args=(finite, grads_and_vars, global_step, name)
        )

    def _cross_replica_apply(
        self,
        distribution: Any,
        finite: Any,
        grads_and_vars: Any,
        global_step: Any,
        name: str | None,
    ) -> Any:
        """The cond runs here, in the cross-replica context, because the inner optimizer's
        ``apply_gradients`` itself merges; ``finite`` is identical on all replicas."""
        finite = distribution.experimental_local_results(finite)[0]
        inner_apply: Callable[..., Any] = self._inner.apply_gradients
        # The inner optimizer's slots are made here, in the caller's graph, not by its
        # apply_gradients inside the cond's branch: there TensorFlow's init_scope can lift
        # them to the eager context once that context is initialised (any earlier
        # tf.config.list_physical_devices call does that), and the branch then fails to
        # capture an eager handle. Slot creation is get-or-make, so the inner call reuses them.
        with tf.init_scope():
            self._inner._create_slots([v for g, v in grads_and_vars if g is not None])  # noqa: SLF001

        def apply_fn() -> Any:
            per_replica = distribution.extended.call_for_each_replica(
                inner_apply, args=(grads_and_vars,), kwargs={"global_step": global_step,
                                                             "name": name}
            )
            return distribution.group(per_replica) if per_replica is not None else None

        # The global step counts in the branch too: a reference one (next to resource weights,
        # as get_or_create_global_step makes it after disable_resource_variables) needs the
        # same TF1 cond.
        written = [v for _, v in grads_and_vars]
        if global_step is not None:
            written.append(global_step)
        with _v1_control_flow_for_reference_variables(written):
            applied = _apply_or_skip.apply_or_skip(
                finite,
                apply_fn,
                self._policy,
                self._state_vars,
                self.floor_warning_skips,
                self.max_consecutive_skips,
            )
        step = global_step if global_step is not None else tf.summary.experimental.get_step()
        if step is not None:
            with tf.control_dependencies([applied]):
                _summaries.write_summaries(self._state_vars[0], self._state_vars[2], step=step)
        if tf.executing_eagerly():
            return None
        train_op = tf.group(applied, name=name or "apply_loss_scaled_gradients")
        # As TF1's own apply_gradients does (the inner one's op, in the cond's branch, was
        # kept out of the outer graph's collections).
        train_ops = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
        if not any(op is train_op for op in train_ops):  # `in` would compare tensors with ==
            train_ops.append(train_op)
        return train_op

    # The v1 base class asks subclasses for these; every call goes to the inner optimizer.
    def _apply_dense(self, grad: Any, var: Any) -> Any:  # pragma: no cover - not reached
        raise NotImplementedError("V1LossScaleOptimizer applies through its inner optimizer")

    _resource_apply_dense = _apply_dense
    _resource_apply_sparse = _apply_dense
    _apply_sparse = _apply_dense


@contextlib.contextmanager
def _v1_control_flow_for_reference_variables(variables: list[Any]) -> Iterator[None]:
    """Builds the apply-or-skip ``cond`` with TF1 control flow (Switch / Merge) when a variable
    its branch writes (a trained one, the global step) is a reference variable
    (``use_resource=False``) in a graph that is no function.

    A control-flow-v2 ``cond`` captures its inputs by value, so a reference variable reached
    its update op as a plain float32 tensor, and the update ("expected float32_ref") failed to
    build: an unmodified TF1 script with such variables failed under the environment.
    ``tf.compat.v1.disable_v2_behavior()`` builds this cond the same way.
    """
    graph = tf.compat.v1.get_default_graph()
    if (
        tf.executing_eagerly()
        or graph.building_function
        or not any(getattr(v.dtype, "_is_ref_dtype", False) for v in variables)
    ):
        yield
        return
    flow = upstream_tf.control_flow_util
    saved = flow.ENABLE_CONTROL_FLOW_V2
    flow.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        flow.ENABLE_CONTROL_FLOW_V2 = saved


def _with_scale(scale: tf.Tensor) -> LossScaleState:
    zero = tf.constant(0, tf.int64)
    return LossScaleState(scale, zero, zero, zero, zero)


def _scaled_callable(policy: LossScale, loss: Callable[[], Any], scale: tf.Tensor):
    return lambda: policy.scale(loss(), _with_scale(scale))
