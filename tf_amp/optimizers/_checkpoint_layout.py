"""The ``tf.train.Checkpoint`` layout of the Keras wrapper: the inner optimizer's, plus the state.

A checkpoint of ``LossScaleOptimizer(Adam())`` holds exactly the names a checkpoint of the
``Adam()`` holds (``_iterations``, ``_variables/2``, ...), and one more child, ``loss_scale``,
with the scale and its counters. So, like tf.keras 2.x's wrapper (which delegated its whole
checkpoint to the inner optimizer), a checkpoint written with the wrapper restores into the
plain optimizer (the ``loss_scale`` entry is left over: ``expect_partial()``), and a plain
optimizer's checkpoint restores into the wrapper (whose scale then starts afresh). The
wrapper's own ``iterations`` / ``learning_rate`` variables, which Keras's base class creates and
nothing reads, are not saved.
"""

from __future__ import annotations

from typing import Any

from tf_amp._upstream.tensorflow import AutoTrackable
from tf_amp.loss_scale import LossScaleState

STATE_CHILD = "loss_scale"
"""Checkpoint name of the loss-scale state under the optimizer's own node."""


class StateTrackable(AutoTrackable):
    """The loss-scale variables as one checkpoint object, each under its field's name."""

    def __init__(self, variables: list[Any]) -> None:
        super().__init__()
        for field, variable in zip(LossScaleState._fields, variables, strict=True):
            setattr(self, field, variable)


def children(wrapper: Any, save_type: str, **kwargs: Any) -> dict[str, Any]:
    """The inner optimizer's checkpoint children, plus the loss-scale state."""
    found = dict(wrapper.inner_optimizer._trackable_children(save_type, **kwargs))  # noqa: SLF001
    found[STATE_CHILD] = wrapper._state_checkpoint  # noqa: SLF001
    return found


class InnerCheckpointLayout:
    """Mixin of the Keras wrapper: ``tf.train.Checkpoint`` and SavedModel see the inner
    optimizer's layout plus the ``loss_scale`` child (see the module docstring)."""

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict:
        return children(self, save_type, **kwargs)

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
