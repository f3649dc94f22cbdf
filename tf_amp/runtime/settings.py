"""What ``TF_ENABLE_AUTO_MIXED_PRECISION`` asks for, and what it means on this machine.

Variables (read here and nowhere else; each value is 1/0, true/false, yes/no or on/off)::

    TF_ENABLE_AUTO_MIXED_PRECISION               both halves below (default for each of them)
    TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE  the graph rewrite only (overrides the above)
    TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING   dynamic loss scaling only (overrides the above)

The target decides what ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` alone turns on (resolved once, when
TensorFlow is imported, by :func:`tf_amp.config.process_target`, and said once in the log):
float16 gets the rewrite and dynamic loss scaling; bfloat16 the rewrite only (float32's exponent
range: nothing underflows); float32 (a CPU without fast reduced precision) nothing at all. The
two specific variables still force their half on or off whatever the target.

Imports neither TensorFlow nor Keras at module level: the startup hook reads the variables
before the script imports anything.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tf_amp._flags import parse_flag
from tf_amp.runtime import _state

_LOG = logging.getLogger("tf_amp")

ENV_ENABLE = "TF_ENABLE_AUTO_MIXED_PRECISION"
ENV_GRAPH_REWRITE = "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE"
ENV_LOSS_SCALING = "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING"
ENV_VARS = (ENV_ENABLE, ENV_GRAPH_REWRITE, ENV_LOSS_SCALING)


@dataclass(frozen=True)
class Settings:
    """Which halves of automatic mixed precision the environment asks for.

    ``None`` for a half means "where the target needs it" (only ``TF_ENABLE_AUTO_MIXED_PRECISION``
    was set); :meth:`for_target` turns it into a yes or no.
    """

    graph_rewrite: bool | None = False
    loss_scaling: bool | None = False

    @property
    def any(self) -> bool:
        return self.graph_rewrite is not False or self.loss_scaling is not False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads the three variables; raises ValueError naming a variable it cannot parse."""
        env = os.environ if environ is None else environ
        enable = parse_flag(env, ENV_ENABLE)
        rewrite = parse_flag(env, ENV_GRAPH_REWRITE)
        scaling = parse_flag(env, ENV_LOSS_SCALING)
        default = None if enable else False
        return cls(
            graph_rewrite=default if rewrite is None else rewrite,
            loss_scaling=default if scaling is None else scaling,
        )

    def for_target(self, target: Any) -> Settings:
        """Settings with every "where needed" half decided for ``target`` (a TargetChoice)."""
        return Settings(
            graph_rewrite=target.rewrites if self.graph_rewrite is None else self.graph_rewrite,
            loss_scaling=(
                target.needs_loss_scaling if self.loss_scaling is None else self.loss_scaling
            ),
        )


def resolved_active() -> Settings | None:
    """The active settings with their "where needed" halves decided, or None when inactive.

    Decided once (when TensorFlow is loaded, or at the first question about them), and said in
    the log with the reason.
    """
    with _state.LOCK:
        active = _state.active_settings()
        if active is None or (active.graph_rewrite is not None and active.loss_scaling is not None):
            return active
        # On use: the target is read from the hardware, which needs TensorFlow loaded.
        from tf_amp.config import mark_target_announced, process_target

        target = process_target(announce=False)
        active = active.for_target(target)
        _state.set_active_settings(active)
        _LOG.info(
            "automatic mixed precision for target %s: graph rewrite: %s, loss scaling: %s (%s)",
            target.dtype,
            "on" if active.graph_rewrite else "off",
            "on" if active.loss_scaling else "off",
            target.reason,
        )
        mark_target_announced(target)  # this line said it: no second line with the same reason
        return active


def rewrite_enabled_globally() -> bool:
    """True when the environment activation turned the graph rewrite on for every model."""
    active = resolved_active()
    return active is not None and bool(active.graph_rewrite)


def loss_scaling_enabled_globally() -> bool:
    """True when the environment activation turned loss scaling on for every optimizer."""
    active = resolved_active()
    return active is not None and bool(active.loss_scaling)
