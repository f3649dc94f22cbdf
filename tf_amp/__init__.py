"""tf_amp: automatic mixed precision for TensorFlow.

A transparent Python graph rewrite (allow / infer / clear / deny painting, minimal casts), a
loss-scaling optimizer for Keras 3 and ``tf.compat.v1.train`` optimizers, and a fused native
unscale + all-finite op.

Public names are resolved lazily (PEP 562) so that ``import tf_amp`` stays cheap: the startup
hook that honours ``TF_ENABLE_AUTO_MIXED_PRECISION`` imports this package in every Python
process, and must cost nothing measurable when the variable is unset.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY_EXPORTS: dict[str, str] = {
    # native op
    "unscale_and_check_finite": "tf_amp.ops",
    "native_op_available": "tf_amp.ops",
    # graph rewrite
    "rewrite_graph_def": "tf_amp.rewriter",
    "RewriteConfig": "tf_amp.config",
    "RewriteResult": "tf_amp.rewriter",
    "OpLists": "tf_amp.lists",
    # loss scaling
    "LossScale": "tf_amp.loss_scale",
    "StaticLossScale": "tf_amp.loss_scale",
    "DynamicLossScale": "tf_amp.loss_scale",
    "LossScaleOptimizer": "tf_amp.optimizers",
    "LossScaleCallback": "tf_amp.optimizers",
    "custom_objects": "tf_amp.optimizers",
    "enable_mixed_precision_graph_rewrite": "tf_amp.enable",
    "disable_mixed_precision_graph_rewrite": "tf_amp.enable",
    # running rewritten graphs
    "function": "tf_amp.runtime.function",
    "Session": "tf_amp.runtime.session",
    "keep_float32": "tf_amp.runtime.function",
}

__all__ = sorted([*_LAZY_EXPORTS, "__version__"])


class _StderrUntilLoggingIsConfigured(logging.StreamHandler):
    """Shows tf_amp's INFO lines ("Converted X/Y nodes ...") in scripts that set up no logging.

    TensorFlow's own pass printed that line by default, and users look for it. Once the
    application configures logging (a handler on the root logger: ``basicConfig``, absl), the
    records reach it by propagation and this handler stays quiet, so nothing is printed twice.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def _install_default_log_handler() -> None:
    logger = logging.getLogger("tf_amp")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not any(isinstance(h, _StderrUntilLoggingIsConfigured) for h in logger.handlers):
        handler = _StderrUntilLoggingIsConfigured()
        handler.setFormatter(logging.Formatter("tf_amp: %(message)s"))
        logger.addHandler(handler)


_install_default_log_handler()


def __getattr__(name: str) -> Any:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tf_amp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__
