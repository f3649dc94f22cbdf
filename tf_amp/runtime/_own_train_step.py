"""Whether a model steps with its own ``train_step``, or with the framework's (Keras 3 or tf_keras).

The environment's loss scaling wraps a model's optimizer at ``compile`` only when the model
uses the framework's ``train_step``: that step calls ``scale_loss`` / ``minimize``, through
which the wrapper scales the loss. A model's own step written for float32 never does, so a
wrapper would divide true gradients by the scale; such steps are loss-scaled by the
``GradientTape.gradient`` patch instead (:mod:`tf_amp.runtime.auto_loss_scale`). The Keras 3
adapter (:mod:`tf_amp.runtime.auto_loss_scale_fit`) and the tf_keras one
(:mod:`tf_amp.runtime.tf_keras_env`) ask the same question, here.

Imports nothing: both adapters reach it without a cycle.
"""

from __future__ import annotations

from typing import Any

_FRAMEWORK_PACKAGES = ("keras", "tf_keras")


def has_own_train_step(model: Any) -> bool:
    """True when ``type(model).train_step`` is defined outside Keras and tf_keras (a subclass's
    own step); False for the framework's, whichever subclass of ``Model`` the model is."""
    module = getattr(type(model).train_step, "__module__", "") or ""
    return module.split(".")[0] not in _FRAMEWORK_PACKAGES
