"""Losses a loss-scale wrapper scaled, so that nothing scales their gradients a second time.

Under ``TF_ENABLE_AUTO_MIXED_PRECISION`` a custom loop's ``tape.gradient`` is loss-scaled for
the user (:mod:`tf_amp.runtime.auto_loss_scale`). A script that already scales its loss with a
wrapper (tf_amp's, Keras 3's or tf_keras's ``scale_loss`` / ``get_scaled_loss``) must not get
that too: the two scales multiply (2**15 x 2**15 overflows float16 on every step), and the
wrapper's ``apply`` never hands the automatic scale the flag that would lower it, so a tf_amp
wrapper, whose scale stops at 1, skipped every step of such a loop. Each wrapper marks the
scaled loss it returns; the automatic path leaves a marked loss to its wrapper.

Marks hold weak references only, keyed by ``id``: a tensor cannot be hashed, and a mark must
keep no tensor or graph alive. A live referent is a live object, so its id names it alone.

A loss computed from a scaled one (``tf.reduce_mean(opt.scale_loss(per_example))``) is scaled
too. Inside a graph (a ``tf.function`` step) the ops that computed the target are walked back
to a marked tensor, only in a graph that holds a mark, so other scripts pay nothing. Eagerly
there is no record of how a tensor was computed: only the wrapper's own result is recognised.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

_MARKED: dict[int, weakref.ref] = {}
_GRAPHS_WITH_MARKS: weakref.WeakSet = weakref.WeakSet()


def mark(scaled_loss: Any) -> Any:
    """Records ``scaled_loss`` as scaled by a wrapper; returns it. A value that is no tensor
    (``loss_scale_factor`` times a Python or NumPy number) is returned unmarked: no tape
    differentiates it, and it cannot be referenced weakly."""
    key = id(scaled_loss)

    def forget(ref: weakref.ref) -> None:
        # Runs when the tensor goes, possibly inside any other code: no lock, and only this
        # tensor's own entry (its id may be taken by a newer mark already).
        if _MARKED.get(key) is ref:
            _MARKED.pop(key, None)

    try:
        ref = weakref.ref(scaled_loss, forget)
    except TypeError:
        return scaled_loss
    graph = _graph_of(scaled_loss)
    if graph is not None:
        _GRAPHS_WITH_MARKS.add(graph)
    _MARKED[key] = ref
    return scaled_loss


def _is_marked_itself(tensor: Any) -> bool:
    ref = _MARKED.get(id(tensor))
    return ref is not None and ref() is tensor


def _graph_of(tensor: Any) -> Any:
    """The graph a symbolic tensor belongs to; None for an eager tensor or a non-tensor."""
    graph = getattr(tensor, "graph", None)
    return None if graph is None or getattr(tensor, "op", None) is None else graph


def is_marked(target: Any) -> bool:
    """True when ``target`` is a loss a wrapper scaled, or (in a graph) was computed from one."""
    if _is_marked_itself(target):
        return True
    graph = _graph_of(target)
    if graph is None or graph not in _GRAPHS_WITH_MARKS:
        return False
    seen = {id(target.op)}
    pending = [target.op]
    while pending:
        for tensor in pending.pop().inputs:
            if _is_marked_itself(tensor):
                return True
            op = tensor.op
            if id(op) not in seen and op.graph is graph:
                seen.add(id(op))
                pending.append(op)
    return False


def marking_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapper's own ``scale_loss`` / ``get_scaled_loss`` (Keras 3's, tf_keras's) that marks
    what it returns; a callable loss gives a callable whose results are marked."""

    def scale(self: Any, loss: Any) -> Any:
        scaled = original(self, loss)
        if callable(scaled):
            return lambda: mark(scaled())
        return scaled if scaled is loss else mark(scaled)

    scale.__wrapped__ = original  # type: ignore[attr-defined]
    scale.__doc__ = original.__doc__
    return scale
