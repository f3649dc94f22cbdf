"""``tf_amp.function``: a ``tf.function`` that runs the mixed-precision rewrite of its graph.

Typical use::

    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))

    @tf_amp.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

How: each trace ``tf.function`` makes is rewritten and rebuilt once, bound to the original
variables (:mod:`tf_amp.runtime._rebuild`), and cached per input signature; calls run the
rebuilt concrete function.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.runtime import _graphdef, _state
from tf_amp.runtime._rebuild import rebuild_concrete_function
from tf_amp.type_attrs.exclude import CALL_OPS

__all__ = [
    "AmpFunction",
    "AmpTfFunction",
    "Function",
    "as_amp_tf_function",
    "function",
    "keep_float32",
    "rebuild_concrete_function",
]


class _ThreadFlags(threading.local):
    """What this thread is doing with tf_amp's functions (read by :class:`AmpTfFunction`)."""

    tracing = 0  # traces of tf_amp functions under way (nested calls trace float32 inside)
    exporting = False  # inside a SavedModel export's request for concrete functions


_flags = _ThreadFlags()
# Traces of tf_amp functions under way in every thread: MirroredStrategy runs each replica of
# a function being traced in a thread of its own, whose flags say nothing of the trace.
_traces_under_way = [0]
_TRACES_LOCK = threading.Lock()


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    """Marks this thread (and, for its replica threads, the process) as tracing."""
    _flags.tracing += 1
    with _TRACES_LOCK:
        _traces_under_way[0] += 1
    try:
        yield
    finally:
        with _TRACES_LOCK:
            _traces_under_way[0] -= 1
        _flags.tracing -= 1


def _inside_a_tf_amp_trace() -> bool:
    """Whether a call is part of a tf_amp trace under way: in its thread, or in a replica
    thread a strategy runs for it (there, a nested function was rewritten on its own inside
    the float32 trace: its half ops went into exported SavedModels, and the outer config was
    not applied to it)."""
    if _flags.tracing:
        return True
    return _traces_under_way[0] > 0 and upstream_tf.in_a_replica_thread()


def _float32_trace(traced: Any, *args: Any, **kwargs: Any) -> Any:
    """TensorFlow's own concrete function of the ``tf.function`` object ``traced`` (through the
    base class: an :class:`AmpFunction`'s own ``get_concrete_function`` returns the rewritten
    one). While it traces, a tf_amp function the body calls is traced float32 into this graph
    (:meth:`AmpTfFunction.__call__`): the trace stays float32 throughout, for export, and its
    one rewrite paints across the call."""
    with _tracing(), upstream_tf.hiding_frames_of(_package_files()):
        return upstream_tf.TfFunction.get_concrete_function(traced, *args, **kwargs)


@functools.cache
def _package_files() -> frozenset[str]:
    """tf_amp's own source files: a runtime error quotes where the user's code made the failing
    op, and tf_amp's frames between the call and the trace say nothing to the user."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return frozenset(
        os.path.join(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".py")
    )


_LOOP_OPS = frozenset({"While", "StatelessWhile"})


def _why_outer_tapes_need_float32(graph: Any) -> str | None:
    """Why a tape recording outside the rebuilt function cannot differentiate it, or None.

    - a ``tf.custom_gradient`` (the ``IdentityN`` carrying its registry key): TensorFlow would
      run the gradient function against the rebuilt graph, where the forward tensors it
      closes over do not exist;
    - a while loop whose body calls a function: the loop's gradient differentiates that call
      symbolically, which needs the resource handle data the rebuilt body's renamed functions
      lost ("Tried to take gradients ... of a variable without handle data").
    """
    graph_def = graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}
    nodes = [*graph_def.node, *(n for f in library.values() for n in f.node_def)]
    if any(n.op == "IdentityN" and "_gradient_op_type" in n.attr for n in nodes):
        return "a tf.custom_gradient"
    bodies = {
        n.attr["body"].func.name for n in nodes if n.op in _LOOP_OPS and "body" in n.attr
    }
    if any(_calls_a_function(library, body) for body in bodies):
        return "a while loop whose body calls a function"
    return None


def _calls_a_function(library: dict[str, Any], name: str) -> bool:
    """Whether library function ``name`` holds a call of another function (a call op, or a node
    whose op is a library function), not counting control-flow bodies, which are walked."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        fdef = library.get(todo.pop())
        if fdef is None or fdef.signature.name in seen:
            continue
        seen.add(fdef.signature.name)
        for node in fdef.node_def:
            if node.op in CALL_OPS or node.op in library:
                return True
            for value in node.attr.values():  # If / While bodies; Case's branches in a list
                todo.extend([value.func.name] if value.func.name else
                            [f.name for f in value.list.func])
    return False


def _say_outer_tape_runs_float32(reason: str) -> None:
    from tf_amp._say_once import say_once

    say_once(
        ("outer tape runs float32", reason),
        logging.WARNING,
        "a rewritten function holding %s was called under a GradientTape that records "
        "outside it, which TensorFlow cannot differentiate once the function is rebuilt: such "
        "calls run the float32 function. Computing the gradient inside the function (the tape "
        "inside, as a training step does) runs it rewritten.",
        reason,
    )


def _say_first_call_runs_float32(traced: Any) -> None:
    from tf_amp._say_once import say_once

    name = getattr(traced, "__name__", "a function")
    say_once(
        ("first call runs float32", id(traced)),  # once per function, not per name
        logging.INFO,
        "%s makes a variable on its first call whose initial value is computed from the "
        "arguments, which TensorFlow cannot lift out of the graph: as tf.function does, that "
        "call runs the first trace, which initialises it (float32, not rewritten); later "
        "calls run rewritten",
        name,
    )


def _unchanged_report(config: Any, graph: Any) -> Any:
    """The report of a trace left as traced, saying why (the target, or opt level O0); the
    choice is said in the log once, as every other way in says it."""
    from tf_amp import hardware
    from tf_amp.config import announce_target
    from tf_amp.report import RewriteReport

    if config.opt_level == "O0":
        reason = "opt level O0"
    else:
        reason = config.target_reason
        announce_target(hardware.TargetChoice(config.target_dtype, reason))
    report = RewriteReport(
        target_dtype=config.target_dtype, target_reason=reason, opt_level=config.opt_level
    )
    report.nodes_before = len(graph.get_operations())
    return report


class Function:
    """A ``tf.function`` whose every concrete function runs the mixed-precision rewrite.

    Tracing is delegated to a plain ``tf.function`` (so retracing rules, ``input_signature`` and
    ``reduce_retracing`` behave exactly as users expect); each traced concrete function is
    rewritten and rebuilt once and cached. ``jit_compile`` is applied to the *rebuilt* function:
    the rewrite must see the graph before XLA clusters it.
    """

    def __init__(
        self,
        python_function: Callable[..., Any],
        *,
        rewrite: _graphdef.RewriteFn | None = None,
        rewrite_config: Any = None,
        jit_compile: bool | None = None,
        traced: Any = None,
        **tf_function_kwargs: Any,
    ) -> None:
        self._python_function = python_function
        self._jit_compile = jit_compile
        self._rewrite_config = rewrite_config
        self._rewrite = rewrite
        self._caller_rewrite = rewrite is not None  # a caller's rewrite decides for itself
        self._tf_function_kwargs = dict(tf_function_kwargs)
        # TensorFlow's own implementation, not the public name: the environment activation may
        # have pointed ``tf.function`` at us. Traced under jit_compile too, so code that must not
        # emit XLA-incompatible ops (print, custom kernels) sees the XLA context while tracing.
        # ``traced`` lets an existing tf.function own the traces (see AmpTfFunction).
        self._traced = traced or upstream_tf.tf_function(
            python_function, jit_compile=jit_compile, **tf_function_kwargs
        )
        self._cache: dict[int, tuple[Any, Any]] = {}
        # id(rebuilt) -> (its float32 original, why), for traces a tape recording outside them
        # cannot differentiate once rebuilt: under such a tape they run float32 (__call__).
        self._float32_under_outer_tapes: dict[int, tuple[Any, str]] = {}
        self.reports: list[Any] = []  # one RewriteReport per rewritten trace
        self._lock = threading.Lock()
        # Name, docstring and __wrapped__ as functools gives them; the wrapped object's own
        # attributes only where this object has none of that name, as tf.function does: a
        # Keras model's ``_lock = False`` or a user's ``_cache`` must not replace this state.
        functools.update_wrapper(self, python_function, updated=())
        for name, value in getattr(python_function, "__dict__", {}).items():
            self.__dict__.setdefault(name, value)

    @property
    def python_function(self) -> Callable[..., Any]:
        """The wrapped Python function (as ``tf.function`` exposes it)."""
        return self._python_function

    @property
    def jit_compile(self) -> bool | None:
        return self._jit_compile

    def _rewrite_fn(self) -> _graphdef.RewriteFn:
        if self._rewrite is None:
            self._rewrite = _graphdef.default_rewrite(self._rewrite_config, self.reports)
        return self._rewrite

    def _trace(self, *args: Any, **kwargs: Any) -> Any:
        """TensorFlow's float32 concrete function for these arguments."""
        return _float32_trace(self._traced, *args, **kwargs)

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The rewritten concrete function for these arguments (traced and rebuilt once)."""
        original = self._trace(*args, **kwargs)
        key = id(original)
        cached = self._cache.get(key)
        if cached is not None and cached[0] is original:
            return cached[1]
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] is original:
                return cached[1]
            config = None if self._caller_rewrite else self._config()
            if config is not None and not config.rewrites:
                rebuilt = original  # float32 target or O0: nothing would change, no rebuild
                self.reports.append(_unchanged_report(config, original.graph))
            else:
                rebuilt = rebuild_concrete_function(
                    original, self._rewrite_fn(), self._jit_compile,
                    add_shapes=config is not None and config.probe,
                    exclude_scopes=config.exclude_scopes if config is not None else (),
                )
                reason = _why_outer_tapes_need_float32(original.graph)
                if reason is not None:
                    self._float32_under_outer_tapes[id(rebuilt)] = (original, reason)
            self._cache[key] = (original, rebuilt)
            return rebuilt

    def _config(self) -> Any:
        """The config this trace is rewritten with (read from the environment at trace time
        when none was given, as ``default_rewrite`` does)."""
        from tf_amp.config import RewriteConfig

        return self._rewrite_config or RewriteConfig.from_env()

    def rewritten_concrete_functions(self) -> list[Any]:
        """The rewritten concrete functions built so far (one per traced input signature)."""
        return [rebuilt for _, rebuilt in self._cache.values()]

    def get_original_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The float32 concrete function ``tf.function`` traced (useful to compare)."""
        return self._trace(*args, **kwargs)

    def experimental_get_tracing_count(self) -> int:
        return self._traced.experimental_get_tracing_count()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tf.config.functions_run_eagerly():
            # As tf.function does: the Python function runs eagerly (nothing is traced to
            # rewrite); Keras's rewritten steps were traced and run as graphs regardless.
            return self._traced(*args, **kwargs)
        # Canonicalise as tf.function does (defaults filled in, numpy -> tensors), then bind
        # and flatten against the traced function type and call the rebuilt function flat.
        traced = self._traced
        bound = upstream_tf.canonicalize_function_inputs(
            args, kwargs, traced._function_type, traced._default_values, traced._is_pure
        )
        args, kwargs = bound.args, bound.kwargs
        try:
            rebuilt = self.get_concrete_function(*args, **kwargs)
        except upstream_tf.UnliftableError:
            first = upstream_tf.first_trace(traced)
            if first is None:
                raise
            # As tf.function does: its first trace initialises the variables it made. Later
            # calls find them made and are traced, rewritten and run as usual.
            _say_first_call_runs_float32(traced)
            return first(*args, **kwargs)
        float32 = self._float32_under_outer_tapes.get(id(rebuilt))
        if float32 is not None and upstream_tf.could_possibly_record():
            rebuilt, reason = float32
            _say_outer_tape_runs_float32(reason)
        flat = rebuilt.function_type.unpack_inputs(rebuilt.function_type.bind(*args, **kwargs))
        return rebuilt._call_flat(flat, captured_inputs=rebuilt.captured_inputs)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """Binds like a method, so ``@tf_amp.function`` works on methods (one cache per object)."""
        if instance is None:
            return self
        bound = instance.__dict__.get(self._bound_attr())
        if bound is None:
            bound = Function(
                self._python_function.__get__(instance, owner),
                rewrite=self._rewrite,
                rewrite_config=self._rewrite_config,
                jit_compile=self._jit_compile,
                **self._tf_kwargs(),
            )
            instance.__dict__[self._bound_attr()] = bound
        return bound

    def _bound_attr(self) -> str:
        return f"_tf_amp_bound_{id(self)}"

    def _tf_kwargs(self) -> dict[str, Any]:
        return dict(self._tf_function_kwargs)


_CONFIG_KEY = "_tf_amp_config"  # an AmpFunction's RewriteConfig, in the object's __dict__
_ENGINE_KEY = "_tf_amp_function"  # the Function that runs its traces' rewrites


class AmpTfFunction(upstream_tf.TfFunction):
    """A genuine ``tf.function`` object whose calls run the mixed-precision rewrite.

    What the environment activation's ``tf.function`` returns for user code. Being a real
    ``tf.function`` (``isinstance`` checks, ``get_concrete_function``, methods, and above all
    ``tf.saved_model.save``, which only exports ``tf.function`` attributes) it keeps unmodified
    scripts working; its traces are the float32 ones, so an exported SavedModel holds float32
    functions (``tf-amp rewrite`` converts it). Calls go through a :class:`Function` that uses
    this object's traces and runs their rewritten rebuilds.
    """

    def _amp(self) -> Function:
        amp = self.__dict__.get(_ENGINE_KEY)
        if amp is None:
            engine = Function(
                self._python_function,
                rewrite_config=self.__dict__.get(_CONFIG_KEY),
                jit_compile=self._jit_compile,
                traced=self,
            )
            # setdefault: two threads calling first both get the one engine (and its cache).
            amp = self.__dict__.setdefault(_ENGINE_KEY, engine)
        return amp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the rewritten function; plain ``tf.function`` behaviour inside another tf_amp
        function's trace (whose rewrite covers this call) and under
        ``tf.config.run_functions_eagerly(True)`` (nothing is traced to rewrite)."""
        if (_inside_a_tf_amp_trace() or tf.config.functions_run_eagerly()
                or self._switched_off()):
            return super().__call__(*args, **kwargs)
        return self._amp()(*args, **kwargs)

    def _switched_off(self) -> bool:
        """Whether this function was made by the environment's ``tf.function`` and the
        environment's graph rewrite is off now (``deactivate()``): it then runs as the
        ``tf.function`` it is, as every ``tf.function`` made after. It kept rewriting every
        trace, so turning tf_amp off left the functions already made in half.
        (``tf_amp.function`` asked for the rewrite itself: it always rewrites.)"""
        if type(self) is not AmpTfFunction:
            return False
        active = _state.active_settings()
        return active is None or active.graph_rewrite is False

    def _clone(self, python_function: Any) -> Any:
        """TensorFlow's copy of this function (``strategy.run`` makes one per call to trace
        in the replica context), of this class and with this config: a plain copy would run
        float32 without a word."""
        clone = upstream_tf.retype_tf_function(super()._clone(python_function), type(self))
        if _CONFIG_KEY in self.__dict__:
            clone.__dict__[_CONFIG_KEY] = self.__dict__[_CONFIG_KEY]
        clone._amp().reports = self._amp().reports  # the clone's rewrites are reported here
        return clone

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The float32 trace, as for a plain ``tf.function`` (calls run its rewrite). Traced
        with the flag that a tf_amp function it calls reads: TensorFlow's own trace left it
        down, so a nested function's call ran rewritten inside this float32 trace (and a
        SavedModel exported under the environment held its half ops, without its
        ``jit_compile=False`` mark)."""
        return _float32_trace(self, *args, **kwargs)

    def _list_all_concrete_functions_for_serialization(self) -> list[Any]:
        # What tf.saved_model.save asks a tf.function for (a private name: tf_amp._upstream's
        # list says why): its traces, float32 throughout, nested tf_amp calls included.
        with _tracing():
            return super()._list_all_concrete_functions_for_serialization()

    def rewritten_concrete_functions(self) -> list[Any]:
        """The rewritten concrete functions built so far.

        Not ``concrete_functions``, which ``tf.function`` objects lack: Keras's export takes
        an object with that attribute for one holding a list of them, and failed on a method.
        """
        return self._amp().rewritten_concrete_functions()

    @property
    def reports(self) -> list[Any]:
        return self._amp().reports


class AmpFunction(AmpTfFunction):
    """What ``tf_amp.function`` returns: a ``tf.function`` object whose calls and concrete
    functions run the mixed-precision rewrite, with its own ``RewriteConfig``.

    Why a ``tf.function`` subclass rather than a wrapper: ``tf.saved_model.save`` exports only
    ``tf.function`` attributes, and a wrapper was left out of the SavedModel without a word.
    Export gets the float32 traces, as for the environment's ``tf.function`` (and as a SavedModel
    written under TensorFlow's own automatic mixed precision holds float32 graphs): a rewrite is
    chosen for the hardware it runs on, which a SavedModel's reader may not share
    (``tf-amp rewrite`` converts one for its target). ``get_concrete_function`` returns the
    rewritten function, since calling it should run what calling this object runs;
    ``get_original_concrete_function`` the float32 one.
    """

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The rewritten concrete function for these arguments (float32 while exported)."""
        if _flags.exporting:
            return self.get_original_concrete_function(*args, **kwargs)
        return self._amp().get_concrete_function(*args, **kwargs)

    def get_original_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The float32 concrete function ``tf.function`` traced (useful to compare)."""
        return _float32_trace(self, *args, **kwargs)

    @property
    def jit_compile(self) -> bool | None:
        return self._jit_compile

    @property
    def rewrite_config(self) -> Any:
        """The ``RewriteConfig`` given to ``tf_amp.function`` (None: read from the environment
        when a trace is rewritten)."""
        return self.__dict__.get(_CONFIG_KEY)

    def _list_all_concrete_functions_for_serialization(self) -> list[Any]:
        # What tf.saved_model.save asks a tf.function for (a private name: tf_amp._upstream's
        # list says why); the base class gathers the signatures and calls
        # get_concrete_function for each, which answers float32 while the flag is up.
        previous, _flags.exporting = _flags.exporting, True
        try:
            return super()._list_all_concrete_functions_for_serialization()
        finally:
            _flags.exporting = previous

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """A method's bound function (one per object, TensorFlow's own binding, which builds it
        anew from the arguments ``tf.function`` keeps) gets this object's config too."""
        bound = super().__get__(instance, owner)
        if bound is not self and _CONFIG_KEY not in bound.__dict__:
            bound.__dict__[_CONFIG_KEY] = self.__dict__.get(_CONFIG_KEY)
        return bound


def as_amp_tf_function(polymorphic: Any) -> AmpTfFunction:
    """Turns a ``tf.function`` object into an :class:`AmpTfFunction` in place (same state;
    ``tf_amp._upstream.tensorflow.retype_tf_function`` says why in place)."""
    return upstream_tf.retype_tf_function(polymorphic, AmpTfFunction)


@contextlib.contextmanager
def keep_float32() -> Iterator[None]:
    """Ops created inside this block are never converted (they carry ``_tf_amp_exclude``).

    The node-attribute way to exclude a region, for code whose name scopes you do not control;
    works in ``tf.function`` / ``tf_amp.function`` bodies, Keras layers called there, and TF1
    graphs. (The name-scope way: ``RewriteConfig(exclude_scopes=...)`` or
    ``TF_AMP_EXCLUDE_SCOPES``.)

        with tf_amp.keep_float32():
            logits = head(features)
    """
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly():
        yield  # eager ops are not rewritten anyway
        return
    from tf_amp.type_attrs import EXCLUDE_ATTR  # on use: type_attrs costs 10 ms to import

    with graph._attr_scope({EXCLUDE_ATTR: attr_value_pb2.AttrValue(b=True)}):  # noqa: SLF001
        yield


def function(
    func: Callable[..., Any] | None = None,
    input_signature: Any = None,
    autograph: bool = True,
    jit_compile: bool | None = None,
    reduce_retracing: bool = False,
    experimental_implements: str | None = None,
    experimental_autograph_options: Any = None,
    experimental_attributes: dict[str, Any] | None = None,
    experimental_relax_shapes: bool | None = None,
    experimental_compile: bool | None = None,
    experimental_follow_type_hints: bool | None = None,
    *,
    config: Any = None,
) -> Any:
    """Like ``tf.function``, but the traced graph runs in mixed precision.

    Same signature as ``tf.function`` plus ``config`` (a ``tf_amp.RewriteConfig``; default: from
    the environment). Usable as ``@tf_amp.function``, ``@tf_amp.function(jit_compile=True)`` or
    ``tf_amp.function(fn)``.
    """
    if experimental_compile is not None and jit_compile is None:
        jit_compile = experimental_compile
    if experimental_relax_shapes:
        reduce_retracing = True
    tf_kwargs: dict[str, Any] = {
        "input_signature": input_signature,
        "autograph": autograph,
        "reduce_retracing": reduce_retracing,
        "experimental_implements": experimental_implements,
        "experimental_autograph_options": experimental_autograph_options,
        "experimental_attributes": experimental_attributes,
        "experimental_follow_type_hints": experimental_follow_type_hints,
    }

    # None is each argument's tf.function default; passing it anyway makes TensorFlow warn
    # that experimental_follow_type_hints is deprecated, for a user who never used it.
    tf_kwargs = {key: value for key, value in tf_kwargs.items() if value is not None}

    def decorate(fn: Callable[..., Any]) -> AmpFunction:
        traced = upstream_tf.tf_function(fn, jit_compile=jit_compile, **tf_kwargs)
        amp = upstream_tf.retype_tf_function(traced, AmpFunction)
        amp.__dict__[_CONFIG_KEY] = config
        return amp

    return decorate if func is None else decorate(func)
