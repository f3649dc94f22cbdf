"""Configs of the tf_keras wrappers: the one they write, and tf_keras's own that they read.

Apart from the wrappers because it is the contract with saved files (``model.save`` in the
``.h5`` and SavedModel formats, ``tf_keras.optimizers.serialize``): ``get_config`` writes tf_amp's
keys plus tf_keras's ``dynamic``, ``initial_scale`` and ``dynamic_growth_steps`` (so code that
reads those keeps working), and ``from_config`` also builds a wrapper from a config of
tf_keras's own ``LossScaleOptimizer``. The Keras 3 wrapper's configs are
:mod:`tf_amp.optimizers._keras_config`; the argument names both accept are
:mod:`tf_amp.optimizers._legacy_scale_args`.
"""

from __future__ import annotations

from typing import Any

from tf_amp import loss_scale as loss_scale_lib
from tf_amp._upstream import tf_keras as upstream
from tf_amp.loss_scale import LossScale
from tf_amp.optimizers._legacy_scale_args import LEGACY_SCALE_ARGS
from tf_amp.optimizers._settled import (
    remember_choice,
    settle_loaded_config,
    settled_by_target,
)
from tf_amp.runtime import _state


class TfKerasConfig:
    """Mixin: ``get_config`` and ``from_config`` of both tf_keras wrappers."""

    _legacy: bool
    _optimizer: Any
    _policy: LossScale
    name: str
    enabled: bool
    floor_warning_skips: int
    max_consecutive_skips: int | None

    def get_config(self) -> dict[str, Any]:
        policy = self._policy
        return {
            "name": self.name,
            "inner_optimizer": upstream.serialize_optimizer(self._optimizer),
            "loss_scale": loss_scale_lib.serialize(policy),
            "enabled": self.enabled,
            "floor_warning_skips": self.floor_warning_skips,
            "max_consecutive_skips": self.max_consecutive_skips,
            "graph_rewrite": _state.optimizer_wants_rewrite(self),
            "settled_by_target": settled_by_target(self),
            # tf_keras's own keys, read-only copies (from_config prefers loss_scale)
            "dynamic": policy.dynamic,
            "initial_scale": policy.initial_scale,
            "dynamic_growth_steps": getattr(policy, "growth_interval", None),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
        """From tf_amp's config or tf_keras's own ``LossScaleOptimizer`` config."""
        config = dict(config)
        inner = config.pop("inner_optimizer")
        if isinstance(inner, dict):
            inner = upstream.deserialize_optimizer(inner, custom_objects, legacy=cls._legacy)
        if "loss_scale" in config:
            for key in LEGACY_SCALE_ARGS:
                config.pop(key, None)
            config["loss_scale"] = loss_scale_lib.deserialize(config["loss_scale"])
        graph_rewrite = config.pop("graph_rewrite", False)
        settled, graph_rewrite = settle_loaded_config(config, graph_rewrite)
        optimizer = cls(inner, **config)
        if settled:
            remember_choice(optimizer)
        if graph_rewrite:
            # On use: the switch loads the tf_keras adapter and the rewriter, which a wrapper
            # that never asked for the rewrite does not need.
            from tf_amp.runtime.rewrite_switch import mark_for_rewrite

            mark_for_rewrite(optimizer)
        return optimizer
