"""Loss scaling and rewrite chosen from the machine's target, for the wrappers that
``enable_mixed_precision_graph_rewrite`` makes: what it chooses here, how a saved wrapper
chooses again where it is loaded, and the scaling a float16-policy model needs anyway.

Apart from ``tf_amp.enable``, which imports the wrappers: their ``from_config`` needs this.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tf_amp._say_once import say_once
from tf_amp.config import process_target

SETTLED_BY_TARGET = "_tf_amp_settled_by_target"
"""Attribute of a wrapper whose loss scaling ``enable_mixed_precision_graph_rewrite`` chose
from the machine's target: the ``enabled`` it chose. Its config says ``settled_by_target``
while ``enabled`` is still that choice, and ``from_config`` then chooses again for the machine
that loads it: a file saved where the target was bfloat16 (no scaling) and loaded where it is
float16 trained float16 unscaled, and one saved where it was float32 (no rewrite) stayed
float32 for good. A value set by hand since is saved as it is."""


def remember_choice(wrapper: Any) -> None:
    """Marks ``wrapper``'s ``enabled`` as the one its target chose (see above)."""
    setattr(wrapper, SETTLED_BY_TARGET, wrapper.enabled)


def settled_by_target(wrapper: Any) -> bool:
    """Whether ``wrapper``'s loss scaling is still what its target chose (see above)."""
    chosen = getattr(wrapper, SETTLED_BY_TARGET, None)
    return chosen is not None and chosen == wrapper.enabled


def scale_for_a_float16_model(model: Any) -> None:
    """Turns on the loss scaling of a wrapper ``enable_mixed_precision_graph_rewrite`` left
    off (a bfloat16 target) when the model's own dtype policy computes in float16
    (``Model(dtype="mixed_float16")``): Keras's and tf_keras's ``compile`` add their scaling
    for such a model, and do not once given a wrapper, so its float16 gradients went
    unscaled. Called where a model is hooked for the rewrite, which a float32 target does not
    do (its wrapper stays as chosen: pass ``loss_scale="dynamic"`` there)."""
    optimizer = getattr(model, "optimizer", None)
    policy = getattr(model, "dtype_policy", None)
    if (
        getattr(optimizer, SETTLED_BY_TARGET, None) is not None
        and not optimizer.enabled
        and getattr(policy, "compute_dtype", None) == "float16"
    ):
        optimizer.enabled = True
        say_once(
            ("float16 model policy", id(model)),
            logging.INFO,
            "loss scaling on (dynamic) for model %r: its dtype policy computes in float16",
            model.name,
        )


def settings_for_this_machine() -> tuple[bool, bool]:
    """(loss scaling on, rewrite on), as ``enable_mixed_precision_graph_rewrite`` with
    ``loss_scale="auto"`` chooses them on this machine."""
    target = process_target()
    return target.needs_loss_scaling or keras_policy_computes_in_float16(), target.rewrites


def settle_loaded_config(config: dict[str, Any], graph_rewrite: bool) -> tuple[bool, bool]:
    """For a wrapper's ``from_config``: pops ``settled_by_target``; when set, puts in
    ``config`` the loss scaling chosen on this machine and returns (True, the rewrite chosen
    here), else (False, ``graph_rewrite`` as saved)."""
    if not config.pop("settled_by_target", False):
        return False, graph_rewrite
    config["enabled"], rewrite = settings_for_this_machine()
    return True, rewrite


def keras_policy_computes_in_float16() -> bool:
    """Whether a loaded Keras (3 or tf_keras) has a global policy computing in float16.

    Why: the wrapper is a loss-scale optimizer, so ``compile`` under ``mixed_float16`` adds
    none of its own; left pass-through because the rewrite's target needs none (bfloat16, or
    float32 on a CPU), the model's float16 gradients underflowed and its layers stopped
    training, silently.
    """
    for name in ("keras", "tf_keras"):
        module = sys.modules.get(name)
        policy = getattr(getattr(module, "mixed_precision", None), "global_policy", None)
        if policy is not None and getattr(policy(), "compute_dtype", None) == "float16":
            say_once(
                ("enable under a float16 policy", name),
                logging.INFO,
                "loss scaling on (dynamic): %s's global policy computes in float16",
                name,
            )
            return True
    return False
