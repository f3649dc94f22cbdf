"""Every private TensorFlow symbol tf_amp uses (``tensorflow.python.*``), and why.

Importing this module checks the TensorFlow (and, when known, Keras) release against
:mod:`tf_amp._upstream.versions` first. All the modules below are already loaded by
``import tensorflow``, so importing them here costs nothing.

The symbols, by who needs them:

Running rewritten graphs (``tf_amp.runtime``)
  * ``polymorphic_function`` -- TensorFlow's own ``tf.function`` implementation: the runtime
    traces through it rather than through the public name, which the environment activation
    points at tf_amp; ``polymorphic_function.Function`` is the class of ``tf.function``
    objects, which :class:`tf_amp.runtime.function.AmpTfFunction` extends. Its
    ``AmpFunction`` (what ``tf_amp.function`` returns) overrides the method
    ``_list_all_concrete_functions_for_serialization``, what ``tf.saved_model.save`` asks a
    ``tf.function`` for: export gets the float32 traces while ``get_concrete_function`` returns
    rewritten ones; no public hook says which concrete functions to export. ``AmpTfFunction``
    overrides ``_clone``, with which ``strategy.run`` copies a ``tf.function`` to trace it in
    the replica context: TensorFlow's own builds a plain ``tf.function``, which would run
    float32.
  * ``lift_to_graph.UnliftableError`` and ``Function._concrete_variable_creation_fn`` (see
    :func:`first_trace`) -- a ``tf.function`` whose first call makes a variable from a value
    computed from its arguments cannot lift that initial value out of the graph; its
    ``__call__`` then runs the first trace, whose variables initialise themselves, and
    ``get_concrete_function`` (what the runtime calls) raises instead.
  * ``concrete_function.ConcreteFunction.from_func_graph`` -- wraps the rebuilt ``FuncGraph``
    as a callable concrete function with the original's calling convention; no public API
    builds a concrete function from a graph.
  * ``ConcreteFunction._attrs`` (see :func:`function_attributes`) -- a concrete function's
    FunctionDef attributes (``experimental_attributes``, ``experimental_implements``'s
    ``_implements``, ``_noinline``...), which its rebuild must carry; no public getter.
  * ``func_graph.FuncGraph`` -- the graph the rewritten GraphDef is imported into, whose
    ``capture`` binds placeholders to the original variables (no public constructor).
  * ``function_type_utils.canonicalize_function_inputs`` -- binds call arguments exactly as
    ``tf.function`` does (defaults, numpy to tensors) before the rebuilt function is called.
  * ``atomic_function.from_function_def`` and ``FuncGraph._functions`` (see
    :func:`hold_library_functions`) -- register the renamed library functions with the eager
    runtime, which resolves function calls by name, as counted ``AtomicFunction`` objects
    held by the function objects the import put in the rebuilt graph: they go when the last
    function that can call them goes, as ``tf.function``'s own do. No public API registers a
    function with a lifetime.
  * ``handle_data_util.copy_handle_data`` -- resource and variant placeholders carry the
    variable's dtype and shape as handle data; without it shape inference loses them.
  * ``pywrap_tf_session.TF_OperationGetStackTrace`` / ``TF_SetOpStackTrace`` (see
    :func:`copy_creation_stack`) -- give an imported op the Python stack of the traced op it
    stands for, which runtime errors quote ("Detected at node ... defined at"); imported ops
    have none, so every error said "<stack traces unavailable>". No public API sets an op's
    stack.
  * ``tf_stack.StackTraceFilter`` (see :func:`hiding_frames_of`) -- leaves tf_amp's own frames
    out of the stacks recorded while it traces a user's function, as TensorFlow leaves out
    its own: an error then quotes the user's lines only.
  * ``tf_optimizer.OptimizeGraph`` -- Grappler's function inliner, run alone before the rewrite
    (``tf.config.optimizer`` can only configure the passes of a running session).
  * ``session.Session`` / ``InteractiveSession`` -- the base classes of ``tf_amp.Session``: the
    public ``tf.compat.v1.Session`` is the name the activation replaces with tf_amp's.
  * ``session._REGISTERED_EXPANSIONS`` and ``session.register_session_run_conversion_functions``
    (see :func:`session_expansion`) -- the fetch and feed functions a script registered for
    its own types, which ``tf_amp.Session`` applies on the user's graph before running the
    private one; TensorFlow exports neither.
  * ``session_manager`` -- the module whose reference to ``session`` the activation swaps, so
    ``MonitoredSession`` and ``Supervisor`` create tf_amp sessions.
  * ``mirrored_run._MirroredReplicaThread`` (see :func:`in_a_replica_thread`) -- the thread
    MirroredStrategy runs each replica of a traced function in: a tf_amp function it calls is
    part of the trace under way in another thread.
  * ``Optional._element_spec`` (see :func:`set_optional_element_spec`) -- the multi-step
    ``fit`` loop carries its outputs as an Optional made empty before the step is traced, as
    Keras's own loop does.

The native op (``tf_amp.ops``)
  * ``parallel_for.pfor`` (``RegisterPFor``, ``wrap``, ``ConversionNotImplementedError``; see
    :func:`register_vectorized`) -- how ``tf.vectorized_map`` converts the op: per-example
    gradients under the environment's loss scaling run it inside the mapped function, and
    without a converter pfor ran it one example at a time in a ``while_loop`` (and warned).

Loss scaling for unmodified scripts (``tf_amp.runtime.auto_loss_scale*``)
  * ``Operation._update_input`` (see :func:`point_input_at`) -- a custom-loop gradient call
    is traced with scale 1 and starts using the loss scale only when an ``apply`` built later
    in the same trace takes its gradients (:mod:`tf_amp.runtime.auto_loss_scale`): the graph
    is still being built, and no public API changes an op's input (TensorFlow's own
    ``cond_v2`` and ``while_v2`` use this one the same way).
  * ``control_flow_v2_func_graphs.ControlFlowFuncGraph`` (see :func:`is_control_flow_graph`)
    -- tells a ``tf.cond`` branch or loop body, which the custom-loop scale switch may live
    outside of, from a nested ``tf.function``, whose trace is reused from other graphs (a
    switch captured from outside it was "out of scope" there).
  * ``Graph._get_function`` (see :func:`function_graph`) -- the graph of a loop body, branch
    or nested function that an op runs: gradients computed there and applied after it are
    the call's to scale. No public API maps a function name to its graph.
  * ``record.could_possibly_record`` -- whether a ``GradientTape.gradient`` call is itself being
    recorded (its result may be differentiated again, and the fused unscale op has no gradient).
  * ``variables._all_saveable_objects`` -- what a ``Saver`` built without ``var_list`` saves,
    to build its twin without the loss-scale state.
  * ``AUTOGRAPH_MODULE`` -- AutoGraph's frames, skipped when asking who called a patched method.
  * ``context.context_safe().context_switches`` -- the eager context's stack of contexts that
    ``init_scope`` lifts to (:func:`forget_eager_outer_context`). The activation makes the
    eager context while a TF1 script is still eager (its device query), and
    ``disable_eager_execution`` leaves the eager entry made then on that stack, which a TF1
    script without the activation never has; no public API clears it.

Optimizer wrappers (``tf_amp.optimizers``)
  * ``summary_ops_v2.has_default_writer`` -- ``tf.summary`` has no public test for a default
    writer, and without one the loss-scale summaries add no op at all.
  * ``tf.__internal__.tracking.AutoTrackable`` -- the base of the checkpoint node that holds the
    loss-scale variables by field name (the public ``tf.Module`` may well write the same
    layout; not switched, so existing checkpoints keep their exact layout).
  * ``tf.__internal__.tracking.DelegatingTrackableMixin`` and
    ``no_automatic_dependency_tracking`` -- the tf_keras wrappers delegate their checkpoint
    dependencies to the inner optimizer, as tf_keras's own ``LossScaleOptimizer`` (their base)
    does, so tf.keras 2.x checkpoints keep their layout; its ``__init__`` is not run, so the
    wrappers call the mixin's and keep their constructor's attributes out of tracking.
  * ``restore._queue_children_for_restoration``'s ``checkpoint_position`` (a local variable,
    read from its frame by :func:`restoring_child_names`) -- a checkpoint's child names at the
    Keras wrapper's node: Keras 3's own wrapper writes a layout whose names overlap tf_amp's,
    and TensorFlow asks for the children one name at a time, so only all the names together
    say which layout is being restored.
  * ``tf.__internal__.tracking.Trackable`` -- the base of the stand-in that takes a Keras 3
    wrapper's unused entries and restores nothing.
  * ``tf.__internal__.distribute.strategy_supports_no_merge_call`` -- whether the strategy can
    run the apply-or-skip ``tf.cond`` in the replica context, or needs ``merge_call`` (as
    Keras's own loss-scale optimizer asks).
  (``tf.__internal__`` is TensorFlow's API for Keras: reachable from the public module, but not
  covered by its compatibility promise, hence listed here.)

The rewrite core (``tf_amp.type_attrs``, ``painter``, ``probe``, ...)
  * ``op_def_registry`` -- OpDefs by name, to know which inputs and outputs share a type attr.
  * ``kernels.get_registered_kernels_for_op`` -- whether a half kernel exists on the device.
  * ``pywrap_tf_session`` (``TF_GetAllOpList``) -- every registered op, to validate op lists.
  * ``tensor_util.constant_value`` -- static values of small tensors (the probe).
  * ``control_flow_util.GraphOrParentsInXlaContext`` -- whether code is being compiled by XLA,
    which compiles no print or assert ops.
  * ``dtypes`` -- bfloat16's numpy type (``ml_dtypes``), for constants cast in the planner.
  * ``_pywrap_events_writer`` -- writes the graph event files TensorBoard's graph tab reads.
  * ``_pywrap_util_port.IsMklEnabled`` -- whether oneDNN (which has the fast bfloat16 kernels)
    is built in.
  * ``pywrap_saved_model.fingerprinting`` -- a rewritten SavedModel's fingerprint file.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import tensorflow as tf

from tf_amp._upstream import versions


def _keras_version() -> str | None:
    """Keras's version when Keras is loaded (TensorFlow loads it lazily), else None."""
    keras = sys.modules.get("keras")
    return getattr(keras, "__version__", None) if keras is not None else None


versions.enforce(tf.__version__, _keras_version())

# Imported after the check (E402 on purpose): on an unsupported release they may be missing.
# ruff: noqa: E402
from tensorflow.core.function.polymorphism import function_type as function_type_lib
from tensorflow.python.client import (
    _pywrap_events_writer,
    pywrap_tf_session,
)
from tensorflow.python.client import session as session_lib
from tensorflow.python.eager import context, lift_to_graph, record
from tensorflow.python.eager.polymorphic_function import (
    atomic_function,
    concrete_function,
    function_type_utils,
)
from tensorflow.python.eager.polymorphic_function import (
    polymorphic_function as _polymorphic_function,
)
from tensorflow.python.framework import (
    dtypes,
    func_graph,
    kernels,
    op_def_registry,
    tensor_util,
)
from tensorflow.python.grappler import tf_optimizer
from tensorflow.python.ops import (
    control_flow_util,
    handle_data_util,
    summary_ops_v2,
)
from tensorflow.python.ops import variables as _variables
from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
from tensorflow.python.training import session_manager
from tensorflow.python.util import _pywrap_util_port, tf_stack

AUTOGRAPH_MODULE = "tensorflow.python.autograph"
"""Module prefix of AutoGraph, whose ``converted_call`` sits between a converted user function
and the calls it makes."""

tf_function = _polymorphic_function.function
"""TensorFlow's ``tf.function`` itself, whatever the public name currently points at."""

TfFunction = _polymorphic_function.Function
"""The class of ``tf.function`` objects."""

ConcreteFunction = concrete_function.ConcreteFunction
UnliftableError = lift_to_graph.UnliftableError
FuncGraph = func_graph.FuncGraph
Session = session_lib.Session
InteractiveSession = session_lib.InteractiveSession
canonicalize_function_inputs = function_type_utils.canonicalize_function_inputs
could_possibly_record = record.could_possibly_record
copy_handle_data = handle_data_util.copy_handle_data
has_default_summary_writer = summary_ops_v2.has_default_writer
AutoTrackable = tf.__internal__.tracking.AutoTrackable
Trackable = tf.__internal__.tracking.Trackable
DelegatingTrackableMixin = tf.__internal__.tracking.DelegatingTrackableMixin
no_automatic_dependency_tracking = tf.__internal__.tracking.no_automatic_dependency_tracking
strategy_supports_no_merge_call = tf.__internal__.distribute.strategy_supports_no_merge_call


def restoring_child_names(trackable: Any) -> frozenset[str] | None:
    """While TensorFlow restores a checkpoint into ``trackable``'s children, the names of the
    children the checkpoint has at its node; None when not called from there.

    TensorFlow's ``restore._queue_children_for_restoration(checkpoint_position, ...)`` calls
    ``trackable._lookup_dependency(name, ...)`` for each child with nothing else, so the names
    are read from that function's ``checkpoint_position`` a few frames up. Meant to be called
    from ``_lookup_dependency``.
    """
    frame = sys._getframe(1)  # noqa: SLF001
    for _ in range(4):  # _lookup_dependency, a helper of it, the queueing function
        frame = frame.f_back
        if frame is None:
            return None
        position = frame.f_locals.get("checkpoint_position")
        if position is not None and getattr(position, "trackable", None) is trackable:
            return frozenset(child.local_name for child in position.object_proto.children)
    return None


def forget_eager_outer_context() -> None:
    """After ``disable_eager_execution``: drops the eager entry the eager context put at the
    bottom of its context-switch stack when it was made while eager execution was on.

    ``init_scope`` in a function graph (a ``cond_v2`` branch) lifts to the innermost entry
    that builds no function; with this one left over, TF1 optimizers' state made there
    (Adam's ``beta1_power``, TensorFlow's ``MixedPrecisionLossScaleOptimizer``'s counters) was
    made eagerly, and the branch failed with "Attempting to capture an EagerTensor without
    building a function". A context made after ``disable_eager_execution`` has no such
    entry; only that exact, lone entry is dropped.
    """
    current = context.context_safe()
    if current is None or current.executing_eagerly():
        return
    switches = current.context_switches
    if (
        len(switches.stack) == 1
        and not switches.stack[0].is_building_function
        and switches.stack[0].enter_context_fn is context.eager_mode
    ):
        switches.pop()


def first_trace(function: Any) -> Any:
    """The concrete function of ``function``'s first trace, the one that made its variables
    (None before its first call).

    Where an initial value cannot be lifted (:data:`UnliftableError`), ``tf.function`` runs
    this trace on the first call: each variable it made initialises itself in the graph when
    it is not initialised yet. Called once, it leaves the variables initialised.
    """
    return getattr(function, "_concrete_variable_creation_fn", None)


def function_attributes(concrete: Any) -> dict[str, Any]:
    """``{name: AttrValue}``: the FunctionDef attributes ``concrete`` was built with."""
    return dict(getattr(concrete, "_attrs", None) or {})


def register_vectorized(op_name: str, convert: Any) -> None:
    """Registers ``convert(inputs, loop_length) -> [(tensor, stacked)]`` as pfor's conversion
    of ``op_name``: ``inputs`` are ``(tensor, stacked)`` pairs, a stacked one carrying the
    loop's iterations in its first dimension. ``convert`` raises ``NotImplementedError`` for
    what it cannot vectorize, and pfor then runs the op in a ``while_loop``, as without it."""
    from tensorflow.python.ops.parallel_for import pfor

    def converter(pfor_input: Any) -> list[Any]:
        if any(wrapped.is_sparse_stacked for wrapped in pfor_input.inputs):
            raise pfor.ConversionNotImplementedError(f"{op_name}: sparse stacked input")
        inputs = [(wrapped.t, wrapped.is_stacked) for wrapped in pfor_input.inputs]
        try:
            outputs = convert(inputs, pfor_input.pfor.loop_len_vector[0])
        except NotImplementedError as error:
            raise pfor.ConversionNotImplementedError(str(error)) from None
        return [pfor.wrap(tensor, stacked) for tensor, stacked in outputs]

    pfor.RegisterPFor(op_name)(converter)


def point_input_at(op: Any, index: int, tensor: Any) -> None:
    """Makes input ``index`` of ``op``, an op of a graph still being built, read ``tensor``
    (of the same graph) instead: ``Operation._update_input``."""
    op._update_input(index, tensor)  # noqa: SLF001


def function_graph(graph: Any, name: str) -> Any:
    """The graph of function ``name`` that ops of ``graph`` run (a loop body, a ``tf.cond``
    branch, a nested ``tf.function``), from the function tables of ``graph`` and the graphs it
    is nested in (``Graph._get_function``); None if none has a graph for it."""
    while graph is not None:
        entry = graph._get_function(name)  # noqa: SLF001
        found = getattr(entry, "graph", None) if entry is not None else None
        if isinstance(found, tf.Graph):
            return found
        graph = getattr(graph, "outer_graph", None)
    return None


def is_control_flow_graph(graph: Any) -> bool:
    """Whether ``graph`` is a ``tf.cond`` branch or a ``while_loop``'s body or condition
    (``control_flow_v2_func_graphs.ControlFlowFuncGraph``): built once for the op that runs
    it, unlike a ``tf.function``'s graph, whose trace TensorFlow may reuse from other graphs."""
    from tensorflow.python.ops import control_flow_v2_func_graphs

    return isinstance(graph, control_flow_v2_func_graphs.ControlFlowFuncGraph)


def in_a_replica_thread() -> bool:
    """Whether this thread is one MirroredStrategy runs a replica of a function in
    (``mirrored_run._MirroredReplicaThread``, private: its threads are not marked otherwise)."""
    from tensorflow.python.distribute import mirrored_run

    replica_thread = getattr(mirrored_run, "_MirroredReplicaThread", None)
    return replica_thread is not None and isinstance(threading.current_thread(), replica_thread)


def hold_library_functions(graph: Any, function_defs: list[Any]) -> None:
    """Registers each FunctionDef with the eager runtime, held by ``graph`` (a ``FuncGraph``
    they were imported into).

    The runtime resolves calls by name and counts the ``AtomicFunction`` objects made for a
    name. The import put a ``_DefinedFunction`` in ``graph._functions`` for each function; a
    concrete function built from ``graph`` keeps those as its children, and a graph that
    calls it copies them, so each holds its ``AtomicFunction``: a function goes when the last
    function that can call it goes. Registered bare (``add_function_def``), every rebuild's
    functions stayed for the process: 400 for 200 dropped ``tf_amp.function`` objects with a
    cond.
    (The ``AtomicFunction`` is not put in ``graph._functions`` itself: TensorFlow asks an
    entry there for its ``.graph`` when it exports or differentiates, and one made from a
    FunctionDef without its full FunctionType cannot give one.)
    """
    held = graph._functions  # noqa: SLF001
    for function_def in function_defs:
        # Only the name and the count matter: callers call it by name.
        atomic = atomic_function.from_function_def(
            function_def, function_type_lib.FunctionType([])
        )
        imported = held.get(function_def.signature.name)
        if imported is None:
            continue  # not imported into the graph: nothing calls it there (freed at once)
        imported._tf_amp_registration = atomic  # noqa: SLF001


class _FramesHidden(tf_stack.StackTraceFilter):
    """Stacks recorded inside leave out the frames of ``files`` (and of outer filters').

    One per thread and file set, reused: entering a filter copies its file set into
    TensorFlow's C++ set, 21 us for tf_amp's files, which every call of a ``tf_amp.function``
    paid (a fifth of a small function's call). A reused one copies only when its parent's
    files changed."""

    def __init__(self, files: frozenset[str]) -> None:
        super().__init__()
        self._files = files
        self._loaded: tuple[Any, Any] | None = None  # (parent, its files) internal_set holds
        self.entered = False

    def __enter__(self) -> Any:
        self.entered = True
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.entered = False

    def get_filtered_filenames(self) -> frozenset[str]:
        return self._files | self.parent.get_filtered_filenames()

    def update(self) -> None:
        parent_files = self.parent.get_filtered_filenames()
        if (
            self._loaded is not None
            and self._loaded[0] is self.parent
            and self._loaded[1] == parent_files
        ):
            return
        self.internal_set.update_to(set(self._files | parent_files))
        self._loaded = (self.parent, parent_files)


_HIDERS = threading.local()


def hiding_frames_of(files: frozenset[str]) -> Any:
    """A context in which the creation stacks of new ops leave out frames of ``files``."""
    hiders = _HIDERS.__dict__.setdefault("by_files", {})
    hider = hiders.get(files)
    if hider is None:
        hider = hiders[files] = _FramesHidden(files)
    elif hider.entered:  # nested (a tf_amp trace inside one): its own, entered once
        return _FramesHidden(files)
    return hider


def copy_creation_stack(op: Any, source: Any) -> None:
    """Gives ``op`` the user's frames of the stack where ``source`` was created (both
    ``tf.Operation``); what an error quotes. ``Operation.traceback`` itself cannot be set on
    another op: its user frames are a new stack, which can."""
    stack = pywrap_tf_session.TF_OperationGetStackTrace(source._c_op)  # noqa: SLF001
    if stack is not None:
        pywrap_tf_session.TF_SetOpStackTrace(op._c_op, stack.get_user_frames()[:])  # noqa: SLF001


def set_optional_element_spec(optional: Any, spec: Any) -> None:
    """Sets the element spec of a ``tf.experimental.Optional`` made empty before it was known.

    Keras's multi-step loop carries its outputs as an Optional that starts empty, with no
    spec, and gives it the step's spec once the step is traced inside the loop
    (``Optional._element_spec``, as Keras's ``TensorFlowTrainer._make_function`` does): there
    is no public way to make an empty Optional of a spec known only after tracing."""
    optional._element_spec = spec  # noqa: SLF001


def all_saveable_objects() -> list[Any]:
    """What a ``tf.compat.v1.train.Saver`` without ``var_list`` saves."""
    return _variables._all_saveable_objects()  # noqa: SLF001


def retype_tf_function(function: Any, cls: type) -> Any:
    """Makes an existing ``tf.function`` object an instance of ``cls`` (a subclass of
    :data:`TfFunction` that adds no state), in place.

    Why in place rather than constructing ``cls`` directly: ``tf.function(...)`` does more
    than call the class (decorator argument handling, deprecated aliases, ``functools`` wrapping
    via ``tf_decorator``), and the object it returns is what user code then holds; re-creating
    that would copy TensorFlow's argument handling. A subclass without new slots or fields
    shares the instance layout, so changing ``__class__`` keeps every piece of state.
    """
    if not isinstance(function, TfFunction):
        raise TypeError(f"expected a tf.function object, got {type(function).__name__}")
    if not issubclass(cls, TfFunction):
        raise TypeError(f"{cls.__name__} must subclass {TfFunction.__name__}")
    function.__class__ = cls
    return function


def session_expansion(value: Any) -> tuple[Any, Any] | None:
    """``(fetch_fn, feed_fn)`` registered for ``value``'s type with
    ``register_session_run_conversion_functions``, or None for a type with none of its own
    (the built-in entries for ``SparseTensor``, ``IndexedSlices`` and ``object``)."""
    for tensor_type, fetch_fn, feed_fn, _ in session_lib._REGISTERED_EXPANSIONS:  # noqa: SLF001
        if isinstance(value, tensor_type):
            if tensor_type in (object, tf.SparseTensor, tf.IndexedSlices):
                return None
            return fetch_fn, feed_fn
    return None


def register_session_fetch(cls: type, fetch_fn: Any) -> None:
    """Registers ``fetch_fn`` (``value -> (fetches, contraction)``) for ``cls`` with
    ``Session.run``."""
    session_lib.register_session_run_conversion_functions(cls, fetch_fn)


__all__ = [
    "AUTOGRAPH_MODULE",
    "AutoTrackable",
    "ConcreteFunction",
    "FuncGraph",
    "InteractiveSession",
    "Session",
    "TfFunction",
    "Trackable",
    "UnliftableError",
    "_pywrap_events_writer",
    "_pywrap_util_port",
    "function_graph",
    "in_a_replica_thread",
    "is_control_flow_graph",
    "point_input_at",
    "register_session_fetch",
    "register_vectorized",
    "session_expansion",
    "all_saveable_objects",
    "canonicalize_function_inputs",
    "control_flow_util",
    "copy_handle_data",
    "copy_creation_stack",
    "could_possibly_record",
    "dtypes",
    "fingerprinting",
    "hiding_frames_of",
    "first_trace",
    "forget_eager_outer_context",
    "function_attributes",
    "hold_library_functions",
    "has_default_summary_writer",
    "kernels",
    "op_def_registry",
    "pywrap_tf_session",
    "restoring_child_names",
    "retype_tf_function",
    "session_manager",
    "set_optional_element_spec",
    "strategy_supports_no_merge_call",
    "tensor_util",
    "tf_function",
    "tf_optimizer",
]
