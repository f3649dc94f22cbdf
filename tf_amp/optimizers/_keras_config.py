"""Configs of the Keras wrapper: the one it writes, and every one a migrating user brings.

``from_config`` accepts, besides tf_amp's own config:

- Keras 3's ``LossScaleOptimizer``: ``inner_optimizer``, ``initial_scale``,
  ``dynamic_growth_steps`` and the base-optimizer keys (``name``, ``clipnorm``...);
- tf.keras 2.x's: ``inner_optimizer``, ``dynamic``, ``initial_scale``, ``dynamic_growth_steps``,
  its inner optimizer possibly carrying tf.keras-only keys (``jit_compile``, ``decay``...);
- TF 2.3's: ``optimizer`` and a ``loss_scale`` of class ``FixedLossScale`` or
  ``DynamicLossScale`` (``initial_loss_scale``, ``increment_period``, ``multiplier``).

``get_config`` writes tf_amp's keys plus ``dynamic``, ``initial_scale`` and
``dynamic_growth_steps``, so code that reads those from a Keras or tf.keras config still can.
"""

from __future__ import annotations

from typing import Any

import keras

from tf_amp import loss_scale as loss_scale_lib
from tf_amp.loss_scale import LossScale, StaticLossScale
from tf_amp.optimizers._legacy_scale_args import LEGACY_SCALE_ARGS, keras_dynamic_scale
from tf_amp.optimizers._settled import settled_by_target

# Keys of a tf.keras 2.x optimizer config that Keras 3 optimizers refuse and that change
# nothing about the update: dropped. (``decay`` is handled apart: non-zero changes training.)
_TF_KERAS_ONLY_KEYS = ("jit_compile", "is_legacy_optimizer")


def wrapper_config(wrapper: Any, graph_rewrite: bool) -> dict[str, Any]:
    """The config ``get_config`` returns: everything ``from_config`` needs, nothing else."""
    policy = wrapper.loss_scale_policy
    return {
        "name": wrapper.name,
        "inner_optimizer": keras.saving.serialize_keras_object(wrapper.inner_optimizer),
        "loss_scale": loss_scale_lib.serialize(policy),
        "enabled": wrapper.enabled,
        "floor_warning_skips": wrapper.floor_warning_skips,
        "max_consecutive_skips": wrapper.max_consecutive_skips,
        # Saved so that load_model gives back an optimizer that still wants the rewrite
        # (enable_mixed_precision_graph_rewrite refuses to wrap a wrapper again).
        "graph_rewrite": graph_rewrite,
        # Both chosen from the saving machine's target (_settled.SETTLED_BY_TARGET): chosen
        # again for the loading machine's.
        "settled_by_target": settled_by_target(wrapper),
        # Read-only copies in Keras 3 / tf.keras 2.x names; from_config ignores them when
        # loss_scale is present, which says the same and more.
        "dynamic": policy.dynamic,
        "initial_scale": policy.initial_scale,
        "dynamic_growth_steps": getattr(policy, "growth_interval", None),
    }


def inner_from_config(
    config: dict[str, Any], custom_objects: dict[str, Any] | None
) -> keras.optimizers.Optimizer:
    """Pops and builds the inner optimizer (``inner_optimizer``, or TF 2.3's ``optimizer``)."""
    key = "inner_optimizer" if "inner_optimizer" in config else "optimizer"
    if key not in config:
        raise ValueError(
            f"a LossScaleOptimizer config names its wrapped optimizer under 'inner_optimizer' "
            f"(Keras 3, tf.keras 2.x, tf_amp) or 'optimizer' (TF 2.3); this one has neither "
            f"(keys: {sorted(config)}). Pass the config get_config() returned."
        )
    inner = config.pop(key)
    if isinstance(inner, dict):
        inner = _without_tf_keras_only_keys(inner)
    # keras.optimizers.deserialize also resolves a bare "SGD" (older configs name no module).
    return keras.optimizers.deserialize(inner, custom_objects=custom_objects)


def _without_tf_keras_only_keys(serialized: dict[str, Any]) -> dict[str, Any]:
    inner_config = dict(serialized.get("config", {}))
    for key in _TF_KERAS_ONLY_KEYS:
        inner_config.pop(key, None)
    if "lr" in inner_config and "learning_rate" not in inner_config:
        inner_config["learning_rate"] = inner_config.pop("lr")
    decay = inner_config.pop("decay", 0.0)
    if decay:
        raise ValueError(
            f"the inner optimizer's config has decay={decay}, a tf.keras 2.x argument Keras 3 "
            "optimizers no longer have; give it learning_rate=keras.optimizers.schedules."
            "InverseTimeDecay(lr, decay_steps=1, decay_rate=decay) instead"
        )
    return dict(serialized, config=inner_config)


def policy_from_config(config: dict[str, Any]) -> LossScale:
    """Pops the loss-scale keys of any of the accepted forms and returns the policy."""
    legacy = {key: config.pop(key) for key in LEGACY_SCALE_ARGS if key in config}
    serialized = config.pop("loss_scale", None)
    if serialized is not None:
        return _policy_from_serialized(serialized)
    dynamic = legacy.get("dynamic", True)
    if not isinstance(dynamic, bool):
        raise TypeError(f"'dynamic' in the config must be True or False, got {dynamic!r}")
    initial = legacy.get("initial_scale")
    initial = 2.0**15 if initial is None else float(initial)
    if not dynamic:
        return StaticLossScale(initial)
    steps = legacy.get("dynamic_growth_steps")
    return keras_dynamic_scale(initial, 2000 if steps is None else int(steps))


def _policy_from_serialized(serialized: Any) -> LossScale:
    if not isinstance(serialized, dict):  # TF 2.3 also wrote a bare number or "dynamic"
        return loss_scale_lib.get(serialized)
    class_name, inner = serialized.get("class_name"), dict(serialized.get("config", {}))
    if class_name == "FixedLossScale":  # TF 2.3 (tf.mixed_precision.experimental)
        return StaticLossScale(float(inner["loss_scale_value"]))
    if class_name == "DynamicLossScale" and "initial_loss_scale" in inner:  # TF 2.3
        multiplier = float(inner.get("multiplier", 2.0))
        return keras_dynamic_scale(
            float(inner["initial_loss_scale"]),
            int(inner.get("increment_period", 2000)),
            growth_factor=multiplier,
            backoff_factor=1.0 / multiplier,
        )
    return loss_scale_lib.deserialize(serialized)

