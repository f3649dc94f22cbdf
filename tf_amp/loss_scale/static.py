"""A fixed loss scale."""

from __future__ import annotations

from typing import Any

from tf_amp.loss_scale._base import LossScale, LossScaleState, checked_scale, i64


class StaticLossScale(LossScale):
    """A fixed loss scale (apex ``static_loss_scale``).

    The scale never changes, but a step with non-finite gradients is still skipped and counted:
    applying ``inf`` or ``nan`` would destroy the weights, and a static scale that is too large
    shows up as a growing ``skipped_steps`` count instead of a silently diverged model.
    """

    def __init__(self, scale: float) -> None:
        self._scale = checked_scale(scale, "StaticLossScale: scale")

    @property
    def dynamic(self) -> bool:
        return False

    @property
    def initial_scale(self) -> float:
        return self._scale

    def after_finite(self, state: LossScaleState) -> LossScaleState:
        zero = i64(0)
        return LossScaleState(state.scale, state.good_steps + 1, state.skipped_steps, zero, zero)

    def after_skip(self, state: LossScaleState) -> LossScaleState:
        return LossScaleState(
            state.scale,
            i64(0),
            state.skipped_steps + 1,
            state.consecutive_skips + 1,
            state.floor_skips,
        )

    def get_config(self) -> dict[str, Any]:
        return {"scale": self._scale}
