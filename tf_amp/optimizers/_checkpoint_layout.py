"""The ``tf.train.Checkpoint`` layout of the Keras wrapper: the inner optimizer's, plus the state.

A checkpoint of ``LossScaleOptimizer(Adam())`` holds exactly the names a checkpoint of the
``Adam()`` holds (``_iterations``, ``_variables/2``, ...), and one more child, ``loss_scale``,
with the scale and its counters. So, like tf.keras 2.x's wrapper (which delegated its whole
checkpoint to the inner optimizer), a checkpoint written with the wrapper restores into the
plain optimizer (the ``loss_scale`` entry is left over: ``expect_partial()``), and a plain
optimizer's checkpoint restores into the wrapper (whose scale then starts afresh). The
wrapper's own ``iterations`` / ``learning_rate`` variables, which Keras's base class creates and
nothing reads, are not saved.

Keras 3's own ``keras.optimizers.LossScaleOptimizer`` writes another layout, which restores
into the wrapper too: the inner optimizer under ``inner_optimizer``, the scale as
``dynamic_scale``, the count of finite steps since it changed as ``step_counter`` (the other
counters start at 0), and at its own node its unused ``_iterations`` / ``_learning_rate`` (0)
and a ``_variables`` list of its four variables. Those three names are names of the layout
above too: read as ours they would reset the inner optimizer's ``iterations`` and learning
rate to 0 and match an int64 counter to a float32 slot (RestoreV2 fails). So where the
checkpoint's node has ``inner_optimizer`` they are bound to stand-ins that restore nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_amp._upstream.tensorflow import AutoTrackable, Trackable, restoring_child_names
from tf_amp.loss_scale import LossScaleState

STATE_CHILD = "loss_scale"
"""Checkpoint name of the loss-scale state under the optimizer's own node."""

TF_STATE_NAMES = ("current_loss_scale", "good_steps", "skipped_steps", "consecutive_skips",
                  "floor_skips")
"""The state's names in the ``loss_scale`` child of the tf_keras and ``tf.compat.v1`` wrappers,
in ``LossScaleState`` order. The first two are the names of TensorFlow's dynamic loss scale
(tf_keras's wrapper, TF1's ``MixedPrecisionLossScaleOptimizer``), whose checkpoints so restore
the scale and its counter."""

KERAS_INNER_CHILD = "inner_optimizer"
"""Where Keras 3's wrapper writes its inner optimizer; a child only its layout has."""

KERAS_OWN_CHILDREN = ("_iterations", "_learning_rate", "_variables")
"""Keras 3's wrapper's own, unused entries, under names of the inner optimizer's layout."""

KERAS_STATE_CHILDREN = {"dynamic_scale": 0, "step_counter": 1}
"""Keras 3's names of its scale variables -> the index of the same state in ours."""

KERAS_NAMES = frozenset({KERAS_INNER_CHILD, *KERAS_STATE_CHILDREN, *KERAS_OWN_CHILDREN})
"""Every name a Keras 3 wrapper's node has that the restore reads its own way."""


class StateTrackable(AutoTrackable):
    """The loss-scale variables as one checkpoint object, each under its name in ``names``
    (``LossScaleState``'s fields; the tf_keras wrapper passes tf_keras's names).

    ``floor_events`` (the counts XLA-compiled steps keep for the host floor checks) is a child
    for SavedModel export only: a ``tf.function`` that applies the optimizer under XLA captures
    it, and export refuses a captured variable it cannot reach. Checkpoints leave it out (a
    count of messages, not training state), so their keys stay what they were.
    """

    def __init__(
        self,
        variables: Sequence[Any],
        floor_events: Any = None,
        names: Sequence[str] = LossScaleState._fields,
    ) -> None:
        super().__init__()
        for name, variable in zip(names, variables, strict=True):
            setattr(self, name, variable)
        object.__setattr__(self, "_floor_events", floor_events)  # not tracked: see above

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        found = super()._trackable_children(save_type, **kwargs)
        if save_type == "savedmodel" and self._floor_events is not None:
            found = {**found, "floor_events": self._floor_events}
        return found


class _Unused(Trackable):
    """Takes one of a Keras 3 wrapper's unused entries: reads its value (in the dtype of the
    same-named variable of ours, which is the saved one: int64 iterations, float32 rate) and
    keeps nothing; a list has no children to restore. The wrapper holds each one (see
    :func:`lookup`): a restore keeps the objects it binds only weakly, and
    ``assert_consumed()`` counts an entry whose object is gone as unresolved."""

    def __init__(self, same_name: Any) -> None:
        self._same_name = same_name

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        return {}

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return self._same_name._serialize_to_tensors()  # noqa: SLF001

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
        return tf.no_op()


def children(wrapper: Any, save_type: str, **kwargs: Any) -> dict[str, Any]:
    """The inner optimizer's checkpoint children, plus the loss-scale state."""
    found = dict(wrapper.inner_optimizer._trackable_children(save_type, **kwargs))  # noqa: SLF001
    found[STATE_CHILD] = wrapper._state_checkpoint  # noqa: SLF001
    return found


def lookup(wrapper: Any, name: str, found: dict[str, Any]) -> Any:
    """The object a restore binds the checkpoint's child ``name`` to (module docstring)."""
    if name not in KERAS_NAMES or not _keras_layout(wrapper, found):
        return found.get(name)
    if name == KERAS_INNER_CHILD:
        return wrapper.inner_optimizer
    if name in KERAS_STATE_CHILDREN:
        return wrapper._state_vars[KERAS_STATE_CHILDREN[name]]  # noqa: SLF001
    same_name = found.get(name)
    if same_name is None:
        return None
    unused = wrapper.__dict__.get("_keras_unused_entries")
    if unused is None:  # past Keras's attribute tracking: not a checkpoint dependency
        unused = {}
        object.__setattr__(wrapper, "_keras_unused_entries", unused)
    return unused.setdefault(name, _Unused(same_name))


def _keras_layout(wrapper: Any, found: dict[str, Any]) -> bool:
    """Whether the node being restored is a Keras 3 wrapper's: it has ``inner_optimizer``,
    which our layout (the inner optimizer's children) does not (an inner optimizer that has a
    child of that name makes it ours, whatever else is there)."""
    if KERAS_INNER_CHILD in found:
        return False
    names = restoring_child_names(wrapper)
    return names is not None and KERAS_INNER_CHILD in names


class InnerCheckpointLayout:
    """Mixin of the Keras wrapper: ``tf.train.Checkpoint`` and SavedModel see the inner
    optimizer's layout plus the ``loss_scale`` child (see the module docstring)."""

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict:
        return children(self, save_type, **kwargs)

    def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
        if cached_dependencies is None:  # the wrapper tracking its own attributes
            return super()._lookup_dependency(name)
        return lookup(self, name, cached_dependencies)  # a restore, given the children above

    @property
    def _deferred_dependencies(self) -> dict:
        # Entries restored before the inner optimizer created them wait on the inner one,
        # which is the object that creates them (Keras's base __init__ asks before it exists).
        inner = self.__dict__.get("inner_optimizer")
        owner = super() if inner is None else inner
        return owner._deferred_dependencies  # noqa: SLF001
