"""Which gradients a ``get_unscaled_gradients`` call already unscaled, per thread and graph.

``apply`` must divide gradients by the scale exactly once. After ``get_unscaled_gradients``
(the TF2 guide's recipe) it must not divide again; otherwise (Keras 3's recipe) it must. The
marks here remember, with weak references only, what each step unscaled, so ``apply`` can tell.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def current_graph() -> Any:
    """The graph being built (a ``FuncGraph`` while tracing), or None when executing eagerly."""
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _weak(value: Any) -> Any:
    return None if value is None else weakref.ref(value)


class UnscaledMark:
    """What one ``get_unscaled_gradients`` call handed out, in one thread and one graph.

    Only weak references: a mark keeps no gradient, graph or thread alive, and a mark whose
    thread or graph is gone can match nothing.
    """

    __slots__ = ("thread", "graph", "inputs", "outputs")

    def __init__(self, graph: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        self.thread = weakref.ref(threading.current_thread())
        self.graph = _weak(graph)
        self.inputs = [_weak(g) for g in inputs]
        self.outputs = [_weak(g) for g in outputs]

    def alive(self) -> bool:
        return self.thread() is not None and (self.graph is None or self.graph() is not None)

    @staticmethod
    def _ids(refs: list[Any]) -> set[int]:
        # A live referent is a live object, so its id() names it and nothing else.
        # (No walrus here: AutoGraph, which converts this method when apply() is traced,
        # cannot parse one and prints a warning asking users to report it.)
        objects = (ref() for ref in refs if ref is not None)
        return {id(obj) for obj in objects if obj is not None}

    def classify(self, grads: Sequence[Any]) -> bool:
        """True when ``grads`` are unscaled: the returned tensors, or tensors the user derived
        from them (clipping between ``get_unscaled_gradients`` and ``apply``); False when they
        are the scaled tensors that were unscaled only to be looked at."""
        outputs = self._ids(self.outputs)
        inputs = self._ids(self.inputs) - outputs
        present = [id(g) for g in grads if g is not None]
        from_inputs = any(i in inputs for i in present)
        if from_inputs and any(i in outputs for i in present):
            raise ValueError(
                "apply() got some of the gradients that get_unscaled_gradients() returned and "
                "some of the scaled gradients it was given; pass the unscaled ones only"
            )
        return not from_inputs


class UnscaledMarks:
    """Open ``get_unscaled_gradients`` results, one per (thread, graph) step.

    A step is one thread building one graph (eager execution counts as one graph): replica
    threads of a MirroredStrategy and separate ``tf.function`` traces each have their own. A
    mark is closed by the ``apply`` of its step, and dropped by the next ``scale_loss`` /
    ``get_scaled_loss`` of its thread and graph, which starts a new step; so it never decides
    how a later step's gradients are treated. A plain object (not a dict attribute) so that
    neither Keras nor ``tf.train.Checkpoint`` tracks it.
    """

    def __init__(self) -> None:
        self._marks: dict[tuple[int, int | None], UnscaledMark] = {}
        # Steps whose loss went through scale_loss: (thread, graph) -> (weak ref to the graph,
        # whether it was scaled in a replica of a tf.distribute strategy).
        self._scaled: dict[tuple[int, int | None], tuple[Any, bool]] = {}

    @staticmethod
    def _key(graph: Any) -> tuple[int, int | None]:
        return (threading.get_ident(), None if graph is None else id(graph))

    def _get(self, graph: Any) -> UnscaledMark | None:
        mark = self._marks.get(self._key(graph))
        if mark is None:
            return None
        if (
            mark.thread() is not threading.current_thread()
            or (mark.graph() if mark.graph is not None else None) is not graph
        ):
            return None  # a dead thread's or graph's id, reused
        return mark

    def find(self) -> tuple[Any, UnscaledMark] | tuple[None, None]:
        """This thread's open mark for the step being built, and the graph it belongs to.

        The step's mark may be in the current graph or one enclosing it (an ``apply`` inside a
        ``tf.cond`` branch); eager, when the function being traced was called eagerly
        (gradients unscaled eagerly, applied in a ``tf.function``); or in a graph nested in the
        current one (unscaled in a ``tf.range`` loop body, applied after the loop).

        Raises ValueError for a mark left in an unrelated, already traced function (unscaled
        in one ``tf.function``, applied eagerly or in another): later calls of that function
        run no Python, so their unscaling could not be seen and ``apply`` would silently
        divide the gradients by the scale a second time.
        """
        graph = current_graph()
        step_graphs = self._step_graphs()
        for g in step_graphs:
            mark = self._get(g)
            if mark is not None:
                return g, mark
        building = {id(g) for g in step_graphs if g is not None}
        me = threading.current_thread()
        for mark in list(self._marks.values()):
            marked = mark.graph() if mark.graph is not None else None
            if mark.thread() is not me or marked is None:
                continue
            outer = getattr(marked, "outer_graph", None)
            while outer is not None and id(outer) not in building:
                outer = getattr(outer, "outer_graph", None)
            if outer is not None:
                return marked, mark
            where = "eagerly" if graph is None else f"in {getattr(graph, 'name', 'a graph')!r}"
            raise ValueError(
                f"get_unscaled_gradients() was traced in tf.function graph "
                f"{getattr(marked, 'name', '?')!r} but apply()/get_unscaled_gradients() now runs "
                f"{where}: later calls of that function run no Python, so their unscaling cannot "
                "be seen and the gradients would be unscaled twice. Call "
                "get_unscaled_gradients() and apply_gradients() in the same tf.function (or "
                "both eagerly), or drop get_unscaled_gradients() and let apply() unscale."
            )
        return None, None

    @staticmethod
    def _step_graphs() -> list[Any]:
        """The graphs being built for this step, innermost first: the current one, those
        enclosing it, and None (eager) when the outermost function is traced from eager code."""
        graph = current_graph()
        step_graphs: list[Any] = []
        g = graph
        while g is not None:
            step_graphs.append(g)
            g = getattr(g, "outer_graph", None)
        if graph is None or tf.compat.v1.executing_eagerly_outside_functions():
            if step_graphs and not hasattr(step_graphs[-1], "outer_graph"):
                step_graphs.pop()  # the global graph tf.function traces under: not this step's
            step_graphs.append(None)  # eager: the caller of the outermost function
        return step_graphs

    def open(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        # copy(): replica threads may insert meanwhile; iterating a copy cannot fail.
        for key in [k for k, m in self._marks.copy().items() if not m.alive()]:
            self._marks.pop(key, None)
        graph = current_graph()
        self._marks[self._key(graph)] = UnscaledMark(graph, inputs, outputs)

    def close(self, graph: Any) -> None:
        self._marks.pop(self._key(graph), None)

    def new_step(self) -> None:
        """A new scaled loss: no unscale before it, here or in the code around this trace
        (an eager look at unscaled gradients), belongs to the step that follows."""
        for graph in self._step_graphs():
            self.close(graph)
        gone = [k for k, (ref, _) in self._scaled.copy().items() if _dead(ref)]
        for key in gone:
            self._scaled.pop(key, None)  # traced graphs that no longer exist
        graph = current_graph()
        self._scaled[self._key(graph)] = (_weak(graph), not _outside_replicas())

    def take_scaled(self) -> bool:
        """True when this step's loss went through ``scale_loss`` (in this graph or one around
        it); the step's ``apply`` consumes it, so the next step must scale again."""
        for graph in self._step_graphs():
            key = self._key(graph)
            if key not in self._scaled:
                continue
            ref, _ = self._scaled[key]
            if (ref() if ref is not None else None) is graph:
                if graph is not None or current_graph() is None:
                    self._scaled.pop(key, None)  # a trace does not consume an eager scale
                return True
        return _outside_replicas() and self._take_replicas_scaled()

    def _take_replicas_scaled(self) -> bool:
        """An ``apply`` outside the replicas (gradients returned by ``strategy.run`` and
        reduced) belongs to the step whose losses the replica threads scaled in this graph."""
        taken = False
        for graph in self._step_graphs():
            graph_id = None if graph is None else id(graph)
            for key, (ref, in_replica) in self._scaled.copy().items():
                if in_replica and key[1] == graph_id and (ref() if ref else None) is graph:
                    self._scaled.pop(key, None)
                    taken = True
        return taken


def _dead(ref: Any) -> bool:
    return ref is not None and ref() is None


def _outside_replicas() -> bool:
    """True unless this thread runs a replica of a strategy (inside ``strategy.run``)."""
    return not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context()


def warn_unscaled_never_scaled() -> None:
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
