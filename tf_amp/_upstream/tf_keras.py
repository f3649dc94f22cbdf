"""Every tf_keras (Keras 2) symbol tf_amp uses, in one place, each with why it is needed.

tf_keras is optional: nothing here imports it at module import. The tf_keras wrappers and the
``fit`` adapter ask this module for what they need, and the first call checks that the
installed tf_keras matches TensorFlow (tf_keras is released in lockstep with TensorFlow: a
2.20 tf_keras next to TensorFlow 2.21 fails in ways that have nothing to do with tf_amp).

Public tf_keras names are used where they exist; the private ones, and why:

* ``tf_keras.src.mixed_precision.loss_scale_optimizer.LossScaleOptimizer`` and
  ``LossScaleOptimizerV3``: the concrete classes behind the public factory
  ``tf_keras.mixed_precision.LossScaleOptimizer`` (which cannot be subclassed usefully: its
  metaclass builds one of these two). tf_amp's wrappers subclass them so that
  ``isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)`` holds, which is what stops
  ``Model.compile`` under a ``mixed_float16`` policy from wrapping the optimizer a second time
  (two scales), and so that the inner optimizer's hyperparameters, slots, weights and
  checkpoint dependencies are delegated exactly as tf.keras 2.x users' files expect.
* ``OptimizerV2._create_all_weights``: creates a legacy optimizer's ``iterations`` and slots.
  The wrapper creates them before its apply-or-skip ``tf.cond``, as tf_keras's own
  ``apply_gradients`` does before it applies: variables must not be created inside a branch.
"""

from __future__ import annotations

import sys
from typing import Any

SUPPORTED = "a tf_keras whose major.minor version equals TensorFlow's (tested: 2.21)"

_CHECKED: list[bool] = []


def loaded() -> bool:
    """True when tf_keras has been imported in this process (nothing here imports it)."""
    return "tf_keras" in sys.modules


def check_version() -> None:
    """Raises ImportError naming the supported pairing when tf_keras does not match TensorFlow."""
    if _CHECKED:
        return
    import tensorflow as tf
    import tf_keras

    tf_version = ".".join(tf.__version__.split(".")[:2])
    keras_version = ".".join(tf_keras.__version__.split(".")[:2])
    if tf_version != keras_version:
        raise ImportError(
            f"tf_amp supports {SUPPORTED}; found tf_keras {tf_keras.__version__} with "
            f"TensorFlow {tf.__version__}. Install the matching one without replacing "
            f"TensorFlow: pip install --no-deps 'tf-keras=={tf_version}.*'"
        )
    _CHECKED.append(True)


def module() -> Any:
    """The ``tf_keras`` package, checked."""
    check_version()
    import tf_keras

    return tf_keras


def optimizer_bases() -> tuple[type, type]:
    """(``tf_keras.optimizers.Optimizer``, ``tf_keras.optimizers.legacy.Optimizer``)."""
    tf_keras = module()
    return tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer


def is_optimizer(optimizer: Any) -> bool:
    """True for a tf_keras optimizer (current or legacy); never imports tf_keras."""
    if not loaded():
        return False
    return isinstance(optimizer, optimizer_bases())


def is_legacy_optimizer(optimizer: Any) -> bool:
    return loaded() and isinstance(optimizer, optimizer_bases()[1])


def loss_scale_optimizer_classes() -> tuple[type, type, type]:
    """(public factory ``BaseLossScaleOptimizer``, ``LossScaleOptimizerV3`` for current
    optimizers, ``LossScaleOptimizer`` for legacy ones): see the module docstring."""
    module()
    from tf_keras.src.mixed_precision import loss_scale_optimizer as lso

    return lso.BaseLossScaleOptimizer, lso.LossScaleOptimizerV3, lso.LossScaleOptimizer


def is_tf_keras_loss_scale_optimizer(optimizer: Any) -> bool:
    """True for tf_keras's own loss-scale optimizer (and for tf_amp's subclasses of it)."""
    return loaded() and isinstance(optimizer, loss_scale_optimizer_classes()[0])


def create_legacy_slots(optimizer: Any, var_list: list[Any]) -> None:
    """``iterations`` and the slots of a legacy optimizer for ``var_list`` (see docstring)."""
    optimizer._create_all_weights(var_list)  # noqa: SLF001


def model_class() -> type:
    """``tf_keras.Model``: it defines ``compile`` and the ``make_*_function`` builders."""
    return module().Model


def save_model_owners() -> list[Any]:
    """The modules whose ``save_model`` saves a tf_keras model: ``saving_api`` (which
    ``Model.save`` calls through its module attribute), and ``tf_keras.models`` and
    ``tf_keras.saving``, which bind the same function under their own names."""
    from tf_keras.src.saving import saving_api

    return [saving_api, module().models, module().saving]


def register_serializable(cls: type) -> type:
    """Registers ``cls`` as ``tf_amp>Name`` with tf_keras's serialization (load_model)."""
    return module().saving.register_keras_serializable(package="tf_amp")(cls)


def serialize_optimizer(optimizer: Any) -> Any:
    return module().optimizers.serialize(optimizer)


def deserialize_optimizer(config: Any, custom_objects: Any, legacy: bool) -> Any:
    return module().optimizers.deserialize(
        config, custom_objects=custom_objects, use_legacy_optimizer=legacy
    )


def global_policy_name() -> str:
    return str(module().mixed_precision.global_policy().name)
