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

Why it works this way (DESIGN.md section 4): TensorFlow 2 cannot run a Python Grappler pass, so
for each input signature we let ``tf.function`` trace, take the traced graph, inline its function
library, rewrite the main graph and every remaining library function, give the library functions
fresh names, and import the result once into a new ``FuncGraph`` whose capture placeholders are
bound to the *original* variable handles. Variables, optimizer slots, BatchNorm statistics and
metrics therefore update in place, exactly as with the float32 function.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2
from tensorflow.python.eager import context
from tensorflow.python.eager.polymorphic_function import concrete_function as cf_lib
from tensorflow.python.eager.polymorphic_function import function_type_utils
from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf_lib
from tensorflow.python.framework import func_graph as func_graph_lib
from tensorflow.python.framework import importer, ops
from tensorflow.python.util import nest

from tf_amp import ops as native_ops
from tf_amp.runtime import _graphdef

_LOG = logging.getLogger("tf_amp")
_XLA_MUST_COMPILE = "_XlaMustCompile"


def rebuild_concrete_function(
    original: Any,
    rewrite: _graphdef.RewriteFn,
    jit_compile: bool | None = None,
    add_shapes: bool = False,
) -> Any:
    """Returns a ConcreteFunction running ``rewrite`` of ``original``'s graph on its variables.

    ``original`` is a traced ``ConcreteFunction``; the result has the same calling convention
    (function type, structured outputs) and the same captures, so it can be called with the same
    arguments and updates the same variables. ``add_shapes`` writes each node's output shapes
    into the GraphDef (``_output_shapes``): the probe needs the shapes of variable reads, which
    a GraphDef otherwise loses.
    """
    graph = original.graph
    captures = list(graph.captures)  # by value: (external value, internal placeholder)
    # By-reference captures (evaluated at call time, e.g. under tf.distribute): key -> nest of
    # placeholders, fed from a closure the ConcreteFunction calls on every call.
    by_ref = graph._function_captures  # noqa: SLF001
    ref_keys = list(by_ref.by_ref_internal)
    capture_ids = {id(internal) for _, internal in captures}
    for key in ref_keys:
        capture_ids |= {id(t) for t in nest.flatten(by_ref.by_ref_internal[key])}
    arg_inputs = [t for t in graph.inputs if id(t) not in capture_ids]
    output_tensors = [t for t in graph.outputs if t is not None]
    control_ops = [op for op in graph.control_outputs]

    fetched = {t.op.name for t in output_tensors}
    keep = fetched | {op.name for op in control_ops} | {t.op.name for t in graph.inputs}
    graph_def = _graphdef.inline_library(graph.as_graph_def(add_shapes=add_shapes), keep)
    with _graphdef.naming_graph(graph.name):
        graph_def = rewrite(graph_def, frozenset(fetched))
    placeholder_names = [t.op.name for t in graph.inputs]
    graph_def = _graphdef.strip_nodes(graph_def, placeholder_names)
    graph_def = _graphdef.rename_library_functions(graph_def)

    # The runtime resolves calls to library functions by name in the eager context; functions
    # imported into a FuncGraph through a GraphDef are not registered there by themselves.
    ctx = context.context()
    for fdef in graph_def.library.function:
        ctx.add_function_def(fdef)

    new_graph = func_graph_lib.FuncGraph(f"tf_amp_{graph.name}")
    replaced: dict[int, tf.Tensor] = {}  # id(old input placeholder) -> new one
    with new_graph.as_default():
        for old in arg_inputs:
            replaced[id(old)] = _placeholder_like(old)
        for external, internal in captures:
            placeholder = new_graph.capture(external, name=internal.op.name)
            _copy_handle_data(internal, placeholder)
            replaced[id(internal)] = placeholder
        for key in ref_keys:
            old_nest = by_ref.by_ref_internal[key]
            new_nest = nest.map_structure(_placeholder_like, old_nest)
            for old, new in zip(nest.flatten(old_nest), nest.flatten(new_nest), strict=True):
                replaced[id(old)] = new
            new_graph._function_captures.add_or_replace(  # noqa: SLF001
                key=key,
                external=by_ref.by_ref_external[key],
                internal=new_nest,
                tracetype=by_ref._by_ref_tracetype[key],  # noqa: SLF001
                is_by_ref=True,
            )
        input_map = {t.name: replaced[id(t)] for t in graph.inputs}
        imported = _import(graph_def, input_map, output_tensors, control_ops)
    tensor_map = dict(zip((t.name for t in output_tensors), imported[0], strict=False))
    tensor_map.update(input_map)

    def remap(value: Any) -> Any:
        if isinstance(value, tf.Tensor) and not isinstance(value, ops.EagerTensor):
            return tensor_map[value.name]
        return value

    new_graph.inputs = [replaced[id(t)] for t in graph.inputs]  # same order as the original
    new_graph.structured_input_signature = graph.structured_input_signature
    new_graph.structured_outputs = nest.map_structure(
        remap, graph.structured_outputs, expand_composites=True
    )
    new_graph.outputs = [tensor_map[t.name] for t in output_tensors]
    new_graph.control_outputs = list(imported[1])
    new_graph.variables = graph.variables

    attrs = {}
    if jit_compile:
        blocking = _ops_without_xla_kernel(graph_def)
        if blocking:
            _LOG.warning(
                "%s has op(s) without an XLA kernel (%s); running the rewritten "
                "function without jit_compile instead of failing to compile it.",
                graph.name,
                ", ".join(sorted(blocking)),
            )
        else:
            attrs[_XLA_MUST_COMPILE] = True
    rebuilt = cf_lib.ConcreteFunction.from_func_graph(
        new_graph, original.function_type, attrs=attrs
    )
    # The flat calling convention (positional / keyword argument names) is set by tf.function
    # after tracing; copy it so flat calls behave the same.
    rebuilt._arg_keywords = original._arg_keywords  # noqa: SLF001
    rebuilt._num_positional_args = original._num_positional_args  # noqa: SLF001
    return rebuilt


# Custom ops known to have CPU/GPU kernels but no XLA kernel.
_NO_XLA_OPS = frozenset({native_ops.NATIVE_OP_NAME})


def _ops_without_xla_kernel(graph_def: graph_pb2.GraphDef) -> set[str]:
    """Op types in ``graph_def`` (library included) that XLA cannot compile."""
    nodes = list(graph_def.node)
    for fdef in graph_def.library.function:
        nodes.extend(fdef.node_def)
    return {n.op for n in nodes if n.op in _NO_XLA_OPS}


def _placeholder_like(old: tf.Tensor) -> tf.Tensor:
    new = tf.raw_ops.Placeholder(dtype=old.dtype, shape=old.shape, name=old.op.name)
    _copy_handle_data(old, new)
    return new


def _copy_handle_data(source: tf.Tensor, target: tf.Tensor) -> None:
    """Resource placeholders carry the variable's dtype/shape as handle data; keep it."""
    if source.dtype in (tf.resource, tf.variant):
        from tensorflow.python.ops import handle_data_util

        handle_data_util.copy_handle_data(source, target)


def _import(
    graph_def: graph_pb2.GraphDef,
    input_map: dict[str, tf.Tensor],
    outputs: list[tf.Tensor],
    control_ops: list[Any],
) -> tuple[list[tf.Tensor], list[Any]]:
    """Imports ``graph_def`` into the default graph; returns the remapped outputs / control ops."""
    mapped = set(input_map)
    fetch_names = [t.name for t in outputs if t.name not in mapped]
    control_names = [op.name for op in control_ops]
    # The importer rejects input_map keys no node reads: an argument the body never uses
    # (a flag, a mask, a step counter) has no reader once its placeholder is stripped.
    read = {
        text if ":" in text else text + ":0"
        for node in graph_def.node
        for text in node.input
        if not text.startswith("^")
    }
    elements = importer.import_graph_def(
        graph_def,
        input_map={name: tensor for name, tensor in input_map.items() if name in read},
        return_elements=fetch_names + control_names,
        name="",
    )
    fetched = dict(zip(fetch_names, elements[: len(fetch_names)], strict=False))
    new_outputs = [input_map[t.name] if t.name in mapped else fetched[t.name] for t in outputs]
    return new_outputs, list(elements[len(fetch_names) :])


def _unchanged_report(config: Any) -> Any:
    """The report of a trace left as traced, saying why (the target, or opt level O0)."""
    from tf_amp.report import RewriteReport

    reason = config.target_reason if config.opt_level != "O0" else "opt level O0"
    return RewriteReport(target_dtype=config.target_dtype, target_reason=reason)


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
        self._traced = traced or pf_lib.function(
            python_function, jit_compile=jit_compile, **tf_function_kwargs
        )
        self._cache: dict[int, tuple[Any, Any]] = {}
        self.reports: list[Any] = []  # one RewriteReport per rewritten trace
        self._lock = threading.Lock()
        functools.update_wrapper(self, python_function)

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

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The rewritten concrete function for these arguments (traced and rebuilt once)."""
        original = self._traced.get_concrete_function(*args, **kwargs)
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
                self.reports.append(_unchanged_report(config))
            else:
                rebuilt = rebuild_concrete_function(
                    original, self._rewrite_fn(), self._jit_compile,
                    add_shapes=config is not None and config.probe,
                )
            self._cache[key] = (original, rebuilt)
            return rebuilt

    def _config(self) -> Any:
        """The config this trace is rewritten with (read from the environment at trace time
        when none was given, as ``default_rewrite`` does)."""
        from tf_amp.config import RewriteConfig

        return self._rewrite_config or RewriteConfig.from_env()

    def concrete_functions(self) -> list[Any]:
        """The rewritten concrete functions built so far (one per traced input signature)."""
        return [rebuilt for _, rebuilt in self._cache.values()]

    def get_original_concrete_function(self, *args: Any, **kwargs: Any) -> Any:
        """The float32 concrete function ``tf.function`` traced (useful to compare)."""
        return self._traced.get_concrete_function(*args, **kwargs)

    def experimental_get_tracing_count(self) -> int:
        return self._traced.experimental_get_tracing_count()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Canonicalise as tf.function does (defaults filled in, numpy -> tensors), then bind
        # and flatten against the traced function type and call the rebuilt function flat.
        traced = self._traced
        bound = function_type_utils.canonicalize_function_inputs(
            args, kwargs, traced._function_type, traced._default_values, traced._is_pure
        )
        args, kwargs = bound.args, bound.kwargs
        rebuilt = self.get_concrete_function(*args, **kwargs)
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


class AmpTfFunction(pf_lib.Function):
    """A genuine ``tf.function`` object whose calls run the mixed-precision rewrite.

    What the environment activation's ``tf.function`` returns for user code. Being a real
    ``tf.function`` (``isinstance`` checks, ``get_concrete_function``, methods, and above all
    ``tf.saved_model.save``, which only exports ``tf.function`` attributes) it keeps unmodified
    scripts working; its traces are the float32 ones, so an exported SavedModel holds float32
    functions (``tf-amp rewrite`` converts it). Calls go through a :class:`Function` that uses
    this object's traces and runs their rewritten rebuilds.
    """

    def _amp(self) -> Function:
        amp = self.__dict__.get("_tf_amp_function")
        if amp is None:
            amp = Function(self._python_function, jit_compile=self._jit_compile, traced=self)
            self.__dict__["_tf_amp_function"] = amp
        return amp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._amp()(*args, **kwargs)

    def concrete_functions(self) -> list[Any]:
        """The rewritten concrete functions built so far."""
        return self._amp().concrete_functions()

    @property
    def reports(self) -> list[Any]:
        return self._amp().reports


def as_amp_tf_function(polymorphic: Any) -> AmpTfFunction:
    """Turns a ``tf.function`` object into an :class:`AmpTfFunction` in place (same state)."""
    if not isinstance(polymorphic, pf_lib.Function):
        raise TypeError(f"expected a tf.function object, got {type(polymorphic).__name__}")
    polymorphic.__class__ = AmpTfFunction
    return polymorphic


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

    def decorate(fn: Callable[..., Any]) -> Function:
        return Function(fn, rewrite_config=config, jit_compile=jit_compile, **tf_kwargs)

    return decorate if func is None else decorate(func)
