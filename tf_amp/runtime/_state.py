"""The switches' shared state: which ways into mixed precision are on, and what they asked for.

Every runtime adapter reads this; the two switches (``enable_mixed_precision_graph_rewrite`` and
the ``TF_ENABLE_AUTO_MIXED_PRECISION`` activation) write it. It imports nothing of tf_amp (and
nothing outside the standard library), so any module may depend on it without forming a cycle:
this is the bottom of the runtime's stack.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

GRAPH_REWRITE_ATTR = "_tf_amp_graph_rewrite"
"""Attribute set to True on a wrapper returned by ``enable_mixed_precision_graph_rewrite``: the
models compiled with it run the rewritten step (the rewrite is scoped to that optimizer)."""

LOCK = threading.RLock()
"""Held while a switch changes state and its patches, so readers see one or the other."""

_rewrite_enabled = False
_active_settings: Any = None
_compile_optimizer_wrapper: Callable[[Any, Any], Any] | None = None


# ------------------------------------------------------------ enable_mixed_precision_graph_rewrite


def mark_optimizer(optimizer: Any) -> None:
    """Marks a tf_amp wrapper as wanting the graph rewrite."""
    setattr(optimizer, GRAPH_REWRITE_ATTR, True)


def optimizer_wants_rewrite(optimizer: Any) -> bool:
    """True for an optimizer returned by ``enable_mixed_precision_graph_rewrite``."""
    return bool(getattr(optimizer, GRAPH_REWRITE_ATTR, False))


def rewrite_enabled() -> bool:
    """True between ``enable_mixed_precision_graph_rewrite`` and ``disable_...``."""
    return _rewrite_enabled


def set_rewrite_enabled(on: bool) -> None:
    global _rewrite_enabled
    _rewrite_enabled = bool(on)


# ----------------------------------------------------------------- TF_ENABLE_AUTO_MIXED_PRECISION


def active_settings() -> Any:
    """The environment activation's ``Settings``, or None when it is not active."""
    return _active_settings


def set_active_settings(settings: Any) -> None:
    global _active_settings
    _active_settings = settings


def compile_optimizer_wrapper() -> Callable[[Any, Any], Any] | None:
    """``(model, optimizer) -> optimizer`` that ``Model.compile`` applies first, or None.

    Set by the environment activation while its loss-scaling half may be on: the Keras adapter
    (below the optimizer wrappers) calls it without knowing about loss scaling, and the
    activation (above them) supplies the wrapping."""
    return _compile_optimizer_wrapper


def set_compile_optimizer_wrapper(wrapper: Callable[[Any, Any], Any] | None) -> None:
    global _compile_optimizer_wrapper
    _compile_optimizer_wrapper = wrapper
