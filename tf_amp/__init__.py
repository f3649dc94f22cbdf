"""tf_amp: automatic mixed precision for TensorFlow.

A transparent Python graph rewrite (allow / infer / clear / deny painting, minimal casts), a
loss-scaling optimizer for Keras 3 and ``tf.compat.v1.train`` optimizers, and a fused native
unscale + all-finite op.

Public names are resolved lazily (PEP 562) so that ``import tf_amp`` stays cheap: the startup
hook that honours ``TF_ENABLE_AUTO_MIXED_PRECISION`` imports this package in every Python
process, and must cost nothing measurable when the variable is unset. Once Keras (or tf_keras) and
TensorFlow are both imported (before or after this package), it registers that framework's
loss-scale wrappers with it, so files saved with them load: about 0.1 s, once.
"""

from __future__ import annotations

import importlib
import logging
import sys
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


class _TfAmpStderrHandler(logging.Handler):
    """Prints tf_amp's records to stderr as ``tf_amp: <message>``, however logging is set up.

    TensorFlow's own pass printed "Converted X/Y nodes ..." by default and users look for it,
    by that text. Going through the root logger made its form depend on who configured logging
    first (``INFO:tf_amp:Converted`` after ``logging.basicConfig()``, absl's
    ``I1125 ... rewriter.py:NNN] Converted`` once absl is set up, nothing at INFO before), so
    the ``tf_amp`` logger keeps this handler and does not propagate.

    An application that wants the records in its own handlers sets
    ``logging.getLogger("tf_amp").propagate = True``: this handler then stays quiet whenever
    the root logger has a handler, so nothing is printed twice. Setting the logger's level (or
    removing this handler) works as for any logger.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("tf_amp: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger("tf_amp").propagate and logging.getLogger().handlers:
            return  # the application took over: its handlers get the record
        try:
            # sys.stderr at each record, not at import: test runners and notebooks swap it.
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never raise into the rewrite
            self.handleError(record)


def _install_default_log_handler() -> None:
    logger = logging.getLogger("tf_amp")
    # By name: a reloaded package defines a new class, and the old handler must still count.
    if any(type(h).__name__ == "_TfAmpStderrHandler" for h in logger.handlers):
        return  # installed already (the package was reloaded)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.addHandler(_TfAmpStderrHandler())
    logger.propagate = False


_install_default_log_handler()


def _check_releases_if_loaded() -> None:
    """Checks the TensorFlow / Keras releases against the supported range when TensorFlow is
    already loaded (then it costs nothing); otherwise the check runs when tf_amp first touches
    TensorFlow (every such module goes through ``tf_amp._upstream``). Raises
    ``tf_amp._upstream.versions.UnsupportedVersionError``, naming the range."""
    tf = sys.modules.get("tensorflow")
    version = getattr(tf, "__version__", None)  # None while TensorFlow is still importing
    if version is None:
        return
    from tf_amp._upstream import versions

    keras = sys.modules.get("keras")
    versions.enforce(version, getattr(keras, "__version__", None))


_check_releases_if_loaded()




def __getattr__(name: str) -> Any:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tf_amp' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    _check_releases_if_loaded()  # the module may have loaded TensorFlow just now
    value = getattr(module, name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__


def _fully_imported(name: str, last_name: str) -> bool:
    """Whether module ``name`` has finished its import: its ``__init__`` defines ``last_name``
    near its end (Keras: ``__version__``; TensorFlow: ``__all__``, its very last line)."""
    return hasattr(sys.modules.get(name), last_name)


# (framework module, the tf_amp module whose import registers its wrappers for loading)
_WRAPPER_MODULES = (
    ("keras", "tf_amp.optimizers.keras"),
    ("tf_keras", "tf_amp.optimizers.tf_keras"),
)


def _ready(framework: str) -> bool:
    """Whether ``framework`` and TensorFlow have both finished importing."""
    return _fully_imported(framework, "__version__") and _fully_imported("tensorflow", "__all__")


def _register_wrappers(framework: str, module: str) -> None:
    """Registers a framework's loss-scale wrappers with its serialization (their module's
    decorators), so ``load_model`` finds them in a file saved with them. It runs inside the
    script's own import of TensorFlow, Keras or tf_keras, which must not fail for it: a
    failure is a warning. Costs about 0.1 s once (the wrappers' modules and the native op)."""
    try:
        importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - any failure here would break the user's import
        logging.getLogger("tf_amp").warning(
            "the %s loss-scale wrapper could not be registered with %s (%s): load a file "
            "saved with it with custom_objects=tf_amp.custom_objects()",
            framework,
            framework,
            error,
        )


def _register_wrappers_once_imported() -> None:
    """Registers each framework's wrappers (Keras 3's, tf_keras's) now if it and TensorFlow
    are imported, else right after both are, whatever the order of the script's imports. Each
    imports the other, so neither one finishing is enough: the second to finish registers
    them (a half-made module has not yet got the names the wrappers' modules read), once no
    tf_amp module is half-made either. A framework the script never imports costs nothing."""
    waiting = []
    for framework, module in _WRAPPER_MODULES:
        if _ready(framework):
            _register_wrappers(framework, module)
        else:
            waiting.append((framework, module))
    if not waiting:
        return
    from tf_amp.runtime._post_import import PostImportHook

    def after_import(_module: Any) -> None:
        if hook not in sys.meta_path:
            return
        for pending in list(waiting):
            if _ready(pending[0]):
                waiting.remove(pending)
                _register_wrappers(*pending)
        if not waiting:
            hook.remove()

    # Deferred while a tf_amp module is importing: ``import tf_amp.ops`` imports TensorFlow
    # half-way through, and the wrappers' modules import names of tf_amp.ops.
    watched = ["tensorflow", *(framework for framework, _ in waiting)]
    hook = PostImportHook(dict.fromkeys(watched, after_import), defer_inside="tf_amp.")
    hook.install()


# Last: the lazy names above may be asked for on the way.
_register_wrappers_once_imported()
