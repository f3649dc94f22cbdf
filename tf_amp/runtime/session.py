"""``tf_amp.Session``: a TF1 ``Session`` that runs the mixed-precision rewrite of its graph.

Typical use (a drop-in for ``tf.compat.v1.Session``)::

    with tf_amp.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for x, y in batches:
            _, loss_value = sess.run([train_op, loss], {images: x, labels: y})
        saver.save(sess, "ckpt/model")

How (the runtime section of docs/ARCHITECTURE.md): the user's graph is rewritten with
``preserve_names=True`` and imported into a private graph that a private session runs. Every
original node name still exists there and still yields its original dtype (an op that became
half moved to a new name and a Cast back to float took its name), so fetches and feeds are
mapped by name, fetched values keep their dtypes, and ``Saver`` (which runs ops by name) works
against ``sess.graph``, which stays the user's graph. Variables keep their names and dtypes, so
checkpoints are interchangeable with float32 training. Ops the user adds later are rewritten and
imported incrementally on the next ``run``, with the already imported nodes held fixed.

Feeding an intermediate tensor: when its op went half, the half consumers read the op's new name,
not the fed (float) name, so the session also feeds the half twin (the value cast to half, as the
Cast a preserved node would get does). The rewritten graph itself stays the same for every feed.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2

from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.runtime import _graphdef

_LOG = logging.getLogger("tf_amp")


class Session(upstream_tf.Session):
    """Runs the name-preserving mixed-precision rewrite of ``graph``; otherwise a TF1 Session.

    ``rewrite_config`` is a ``tf_amp.RewriteConfig`` (default: from the environment);
    ``preserve_names`` is always forced on, because name-based fetching depends on it.
    """

    def __init__(
        self,
        target: str = "",
        graph: tf.Graph | None = None,
        config: Any = None,
        *,
        rewrite_config: Any = None,
    ) -> None:
        super().__init__(target, graph, config)  # self._graph: the user's graph (sess.graph)
        self._amp_graph = tf.Graph()
        self._amp_inner = upstream_tf.Session(target, graph=self._amp_graph, config=config)
        self._amp_imported: set[str] = set()  # user node names already in the private graph
        self._amp_renamed: dict[str, str] = {}  # user node name -> its half twin's name
        self._amp_synced_version = -1
        self._amp_sync_lock = threading.Lock()
        self.rewrite_reports: list[Any] = []  # one report per rewrite, for inspection
        # Name-based fetching depends on name-preserving mode, so it is forced on.
        self._amp_rewrite = _graphdef.default_rewrite(
            rewrite_config, self.rewrite_reports, preserve_names=True
        )

    # -- the private, rewritten graph -------------------------------------------------------

    @property
    def rewritten_graph(self) -> tf.Graph:
        """The graph this session actually runs (for inspection and tests)."""
        self._sync()
        return self._amp_graph

    def _sync(self) -> None:
        """Rewrites and imports the user's nodes that the private graph lacks."""
        if self._graph.version == self._amp_synced_version:
            return
        with self._amp_sync_lock:
            version = self._graph.version
            if version == self._amp_synced_version:
                return
            graph_def = self._graph.as_graph_def()
            if any(n.name not in self._amp_imported for n in graph_def.node):
                self._import_new(graph_def)
            self._amp_synced_version = version

    def _import_new(self, graph_def: graph_pb2.GraphDef) -> None:
        frozen = frozenset(self._amp_imported)
        rewritten = self._amp_rewrite(graph_def, frozen)
        self._amp_renamed.update(self.rewrite_reports[-1].renamed)
        existing = {op.name for op in self._amp_graph.get_operations()}
        subset = graph_pb2.GraphDef()
        subset.versions.CopyFrom(rewritten.versions)
        subset.library.CopyFrom(rewritten.library)
        for node in rewritten.node:
            if node.name not in existing:
                subset.node.add().CopyFrom(node)
        subset = _graphdef.rename_library_functions(subset) if frozen else subset
        input_map, controls = self._external_inputs(subset, existing)
        colocations = _take_external_colocations(subset)
        with self._amp_graph.as_default():
            tf.graph_util.import_graph_def(subset, input_map=input_map, name="")
        get_op = self._amp_graph.get_operation_by_name
        for node_name, op_name in controls:
            get_op(node_name)._add_control_input(get_op(op_name))  # noqa: SLF001
        for node_name, value in colocations:
            get_op(node_name)._set_attr(_COLOCATION_ATTR, value)  # noqa: SLF001
        self._amp_imported |= {n.name for n in graph_def.node}

    def _external_inputs(
        self, subset: graph_pb2.GraphDef, existing: set[str]
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """Maps data inputs of the new nodes that name already imported nodes to those
        tensors; returns them and the (new node, imported op) control edges.

        The control edges are taken out of ``subset`` and added after the import: the importer
        accepts an Operation in ``input_map`` only under a non-empty import name scope, and the
        new nodes must keep their names.
        """
        inside = {n.name for n in subset.node}
        input_map: dict[str, Any] = {}
        controls: list[tuple[str, str]] = []
        for node in subset.node:
            kept = []
            for name in node.input:
                control = name.startswith("^")
                op_name = name[1:] if control else name.split(":")[0]
                if op_name in inside or op_name not in existing:
                    kept.append(name)
                elif control:
                    controls.append((node.name, op_name))
                else:
                    kept.append(name)
                    tensor = name if ":" in name else f"{name}:0"
                    input_map[name] = self._amp_graph.get_tensor_by_name(tensor)
            if len(kept) != len(node.input):
                del node.input[:]
                node.input.extend(kept)
        return input_map, controls

    # -- mapping user-graph objects to the private graph -------------------------------------

    def _map(self, fetch: Any, feed: bool = False) -> Any:
        """Maps a (nested) fetch or feed key of the user's graph to the private graph."""
        if fetch is None:
            return None
        if isinstance(fetch, (str, bytes)):
            return self._amp_graph.as_graph_element(
                fetch.decode() if isinstance(fetch, bytes) else fetch
            )
        if isinstance(fetch, (tf.Operation, tf.Tensor)):
            self._check_graph(fetch, feed)
            if isinstance(fetch, tf.Operation):
                return self._amp_graph.get_operation_by_name(fetch.name)
            return self._amp_graph.get_tensor_by_name(fetch.name)
        recurse = functools.partial(self._map, feed=feed)
        if isinstance(fetch, _COMPOSITE_FETCHES):
            # The same kind of value made of the private graph's components (a RaggedTensor's
            # graph element is its flat values alone, so the generic path below returned those
            # without their row structure). Not any CompositeTensor: a variable is one too.
            with self._amp_graph.as_default():
                return tf.nest.map_structure(recurse, fetch, expand_composites=True)
        if isinstance(fetch, Mapping):
            items = ((k, recurse(v)) for k, v in fetch.items())
            if isinstance(fetch, collections.defaultdict):
                return type(fetch)(fetch.default_factory, items)
            return type(fetch)(items)
        if isinstance(fetch, tuple) and hasattr(fetch, "_fields"):
            return type(fetch)(*(recurse(v) for v in fetch))
        if isinstance(fetch, (list, tuple)):
            return type(fetch)(recurse(v) for v in fetch)
        if getattr(type(fetch), "__attrs_attrs__", None) is not None:  # as Session.run does
            return type(fetch)(*(recurse(getattr(fetch, a.name)) for a in fetch.__attrs_attrs__))
        expansion = upstream_tf.session_expansion(fetch)
        if expansion is not None and not feed:
            fetches, contraction = expansion[0](fetch)
            return _Expanded([recurse(f) for f in fetches], contraction)
        if hasattr(fetch, "_as_graph_element"):
            return recurse(fetch._as_graph_element())  # noqa: SLF001
        raise TypeError(
            f"tf_amp.Session cannot fetch or feed {fetch!r} of type {type(fetch).__name__}"
        )

    def _check_graph(self, element: Any, feed: bool) -> None:
        """Refuses a tensor or op of another graph, as ``tf.compat.v1.Session`` does: looked up
        by name, it would silently run this graph's namesake instead."""
        if element.graph is self._graph:
            return
        if feed:
            raise TypeError(
                f"Cannot interpret feed_dict key as Tensor: {element!r} is not an element of "
                f"this session's graph."
            )
        raise ValueError(
            f"Fetch argument {element!r} cannot be interpreted as a Tensor: it is not an "
            f"element of this session's graph."
        )

    def _half_twin(self, tensor: Any) -> tf.Tensor | None:
        """The half output that half consumers read instead of ``tensor`` (a fed tensor of the
        private graph), or None when ``tensor``'s op kept its name or this port stayed float."""
        if not isinstance(tensor, tf.Tensor):
            return None
        new_name = self._amp_renamed.get(tensor.op.name)
        if new_name is None:
            return None
        twin = self._amp_graph.get_tensor_by_name(f"{new_name}:{tensor.value_index}")
        return twin if twin.dtype != tensor.dtype else None

    @staticmethod
    def _cast_feed(value: Any, twin: tf.Tensor) -> np.ndarray:
        return np.asarray(value).astype(twin.dtype.as_numpy_dtype)

    def _map_feeds(self, feed_dict: Mapping[Any, Any] | None) -> dict[Any, Any] | None:
        if not feed_dict:
            return feed_dict
        mapped: dict[Any, Any] = {}
        for key, value in self._expanded_feeds(feed_dict):
            target = self._map(key, feed=True)
            mapped[target] = value
            twin = self._half_twin(target)
            if twin is not None:  # the half consumers read the twin: feed it the same value
                mapped[twin] = self._cast_feed(value, twin)
        return mapped

    @staticmethod
    def _expanded_feeds(feed_dict: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
        """The feed_dict's items, a key of a type the script registered a feed function for
        expanded into the (tensor, value) pairs that function gives, as ``Session.run`` does."""
        pairs: list[tuple[Any, Any]] = []
        for key, value in feed_dict.items():
            expansion = upstream_tf.session_expansion(key)
            if expansion is not None and expansion[1] is not None:
                pairs.extend(expansion[1](key, value))
            else:
                pairs.append((key, value))
        return pairs

    def _map_feed_list(self, feeds: list[Any]) -> tuple[list[Any], list[tuple[int, Any]]]:
        """Mapped feeds plus the half twins to feed too: (position of the fed value, twin)."""
        mapped = [self._map(f, feed=True) for f in feeds]
        twins = [(i, t) for i, f in enumerate(mapped) if (t := self._half_twin(f)) is not None]
        return mapped + [t for _, t in twins], twins

    # -- Session API ------------------------------------------------------------------------

    def run(
        self,
        fetches: Any,
        feed_dict: Mapping[Any, Any] | None = None,
        options: Any = None,
        run_metadata: Any = None,
    ) -> Any:
        """Runs the rewritten graph; same arguments and results as ``Session.run``."""
        self._sync()
        return self._amp_inner.run(
            self._map(fetches), self._map_feeds(feed_dict), options, run_metadata
        )

    def make_callable(
        self, fetches: Any, feed_list: list[Any] | None = None, accept_options: bool = False
    ) -> Any:
        self._sync()
        if feed_list is None:
            return self._amp_inner.make_callable(self._map(fetches), None, accept_options)
        mapped_feeds, twins = self._map_feed_list(list(feed_list))
        inner = self._amp_inner.make_callable(self._map(fetches), mapped_feeds, accept_options)
        if not twins:
            return inner

        def call(*args: Any, **kwargs: Any) -> Any:
            extra = [self._cast_feed(args[i], twin) for i, twin in twins]
            return inner(*args, *extra, **kwargs)

        return call

    def partial_run_setup(self, fetches: Any, feeds: list[Any] | None = None) -> Any:
        self._sync()
        mapped_feeds = None if feeds is None else self._map_feed_list(list(feeds))[0]
        return self._amp_inner.partial_run_setup(self._map(fetches), mapped_feeds)

    def partial_run(self, handle: Any, fetches: Any, feed_dict: Any = None) -> Any:
        self._sync()
        return self._amp_inner.partial_run(handle, self._map(fetches), self._map_feeds(feed_dict))

    def close(self) -> None:
        self._amp_inner.close()
        super().close()


class InteractiveSession(Session, upstream_tf.InteractiveSession):
    """``tf.compat.v1.InteractiveSession`` running the rewritten graph.

    It installs itself as the default session on construction (TensorFlow's
    ``InteractiveSession.__init__`` runs in the chain), so ``Tensor.eval()`` and
    ``Operation.run()`` reach :meth:`Session.run` and run the rewritten graph; ``close()``
    uninstalls it. ``isinstance(sess, tf.compat.v1.InteractiveSession)`` stays true.
    """

    def __init__(
        self,
        target: str = "",
        graph: tf.Graph | None = None,
        config: Any = None,
        *,
        rewrite_config: Any = None,
    ) -> None:
        # TensorFlow's InteractiveSession defaults, applied here so the private session that
        # runs the rewritten graph gets them too (pruned placement: fetch part of a graph whose
        # other ops cannot be placed).
        if not config:
            config = config_pb2.ConfigProto(gpu_options=config_pb2.GPUOptions(allow_growth=True))
        config.graph_options.place_pruned_graph = True
        super().__init__(target, graph, config, rewrite_config=rewrite_config)


class SessionModuleShim:
    """Stands in for ``tensorflow.python.client.session`` inside ``session_manager``.

    ``tf.compat.v1.train.MonitoredSession``, ``MonitoredTrainingSession`` and ``Supervisor``
    create their sessions through ``SessionManager``, which calls ``session.Session(...)`` on
    its own module reference, never ``tf.compat.v1.Session``. Replacing that one reference
    (patched and restored by the activation) makes them create :class:`Session`; every other
    attribute is the real module's.
    """

    Session = Session

    def __init__(self, real_module: Any) -> None:
        self._real = real_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_COMPOSITE_FETCHES = (tf.SparseTensor, tf.RaggedTensor, tf.IndexedSlices)


class _Expanded:
    """A fetch of a type the script registered with ``register_session_run_conversion_functions``:
    its fetches (from the registered function) mapped to the private graph, and the
    contraction that builds the user's value from their results."""

    def __init__(self, fetches: list[Any], contraction: Any) -> None:
        self.fetches = fetches
        self.contraction = contraction


upstream_tf.register_session_fetch(_Expanded, lambda e: (e.fetches, e.contraction))

_COLOCATION_ATTR = "_class"  # ["loc:@op", ...]: place this node with those ops


def _take_external_colocations(subset: graph_pb2.GraphDef) -> list[tuple[str, Any]]:
    """Takes out of ``subset`` the colocation attrs that name ops outside it; returns them,
    to be set back once the subset is imported.

    An op added after the session's first run (an ``ExponentialMovingAverage``, a
    ``tf.compat.v1.train.Checkpoint``'s lazily made ``save_counter``, slots) is often
    colocated with a variable imported earlier, and the importer refuses a colocation with a
    node that is not in what it imports ("expects to be colocated with unknown node").
    """
    inside = {node.name for node in subset.node}
    taken = []
    for node in subset.node:
        value = node.attr.get(_COLOCATION_ATTR)
        if value is None:
            continue
        names = [entry.decode()[len("loc:@"):] for entry in value.list.s]
        if any(name not in inside for name in names):
            kept = type(value)()
            kept.CopyFrom(value)
            taken.append((node.name, kept))
            del node.attr[_COLOCATION_ATTR]
    return taken
