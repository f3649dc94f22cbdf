"""Saver patches for the loss-scale state of v1 wrappers: a checkpoint without the state
(float32 training's, or TF1 ``MixedPrecisionLossScaleOptimizer``'s) restores into a graph that
has it. Installed for good by the first v1 wrapper whose state lives in a graph
(:func:`install_saver_patches`), and by the environment activation with its other patches;
both hold the same replacements in the one patch registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_amp._upstream import tensorflow as upstream_tf

_LOG = logging.getLogger("tf_amp")
SAVER_HOLDER = "tf_amp.optimizers.v1 (Saver of loss-scale state)"


def _loss_scale_field(value: Any) -> str | None:
    """The ``LossScaleState`` field a v1 wrapper's state variable holds; None for the rest."""
    return getattr(value, "_tf_amp_loss_scale_field", None)


def install_saver_patches() -> None:
    """Makes ``Saver`` restore into a graph with v1 loss-scale state a checkpoint that lacks it
    (below). Installed by the first v1 wrapper whose state lives in a graph, for good: the
    patches act only on savers that cover such state, and cost others one scan of their list."""
    from tf_amp.runtime._patches import REGISTRY

    saver = tf.compat.v1.train.Saver
    REGISTRY.acquire(SAVER_HOLDER, saver, "build", saver_build_patch)
    REGISTRY.acquire(SAVER_HOLDER, saver, "restore", saver_restore_patch)


def saver_build_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.compat.v1.train.Saver.build`` (which ``__init__`` calls, or the script itself after
    ``defer_build=True``) that also builds, when the saver covers the loss-scale state of a v1
    wrapper, a second saver without it (see the restore patch).

    Built now, at graph construction: by restore time a MonitoredTrainingSession has
    finalized the graph."""

    def build(self: Any) -> None:
        original(self)
        if "_tf_amp_without_state" in self.__dict__:
            return
        var_list = self._var_list  # noqa: SLF001 - what this saver was asked to cover
        covered = var_list if var_list is not None else upstream_tf.all_saveable_objects()
        if isinstance(covered, dict):
            ours = [(k, v) for k, v in covered.items() if _loss_scale_field(v)]
            rest: Any = {k: v for k, v in covered.items() if not _loss_scale_field(v)}
        else:
            ours = [(v.op.name, v) for v in covered if _loss_scale_field(v)]
            rest = [v for v in covered if not _loss_scale_field(v)]
        if ours and rest:
            # A saver over `rest` covers no loss-scale state, so this patch does not recurse.
            # Read as this saver reads: sharded, and reshaping if it was asked to.
            fallback = type(self)(rest, sharded=self._sharded, reshape=self._reshape)  # noqa: SLF001
            self.__dict__["_tf_amp_without_state"] = (fallback, ours)

    build.__wrapped__ = original  # type: ignore[attr-defined]
    return build


# TF1's MixedPrecisionLossScaleOptimizer names its dynamic scale's two variables so.
_TF1_NAMES = {"scale": "current_loss_scale", "good_steps": "good_steps"}


def saver_restore_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Saver.restore`` that restores into a graph with v1 loss-scale state a checkpoint
    without it, where a plain Saver fails on the first missing key:

    - one written without tf_amp (float32 training): the rest is restored and the state
      starts afresh (initial scale), as in a new run;
    - one of TensorFlow's ``MixedPrecisionLossScaleOptimizer``: its ``current_loss_scale`` and
      ``good_steps`` become the scale and its counter (one wrapper in the graph: with several,
      which scale was whose cannot be told, and they start afresh);
    - a checkpoint that has the state restores it as usual."""

    def restore(self: Any, sess: Any, save_path: Any) -> Any:
        without = self.__dict__.get("_tf_amp_without_state")
        if without is None or save_path is None:
            return original(self, sess, save_path)
        fallback, ours = without
        try:
            saved = {name: shape for name, shape in tf.train.list_variables(save_path)}
        except (tf.errors.OpError, ValueError):
            return original(self, sess, save_path)  # let the Saver report what is wrong
        if all(key in saved for key, _ in ours):
            return original(self, sess, save_path)
        fallback.restore(sess, save_path)
        scales = [v for _, v in ours if _loss_scale_field(v) == "scale"]
        from_tf1 = len(scales) == 1 and all(name in saved for name in _TF1_NAMES.values())
        # Values go in through the variables' own initializers, fed: by restore time a
        # MonitoredTrainingSession has finalized the graph, so no op may be added now.
        feeds, initializers, loaded = {}, [], set()
        for own_key, variable in ours:
            key = _TF1_NAMES.get(_loss_scale_field(variable)) if from_tf1 else None
            key = own_key if own_key in saved else key
            initializers.append(variable.initializer)
            if key is not None and saved[key] == []:
                feeds[variable.initializer.inputs[1]] = tf.train.load_variable(save_path, key)
                loaded.add(key)
        sess.run(initializers, feeds)
        if loaded:
            what = (f"holds part of the loss-scale state ({', '.join(sorted(loaded))}): "
                    "restored, the rest starts afresh")
        else:
            what = ("has no loss-scale state (written without tf_amp); restoring the rest, the "
                    "loss scale starts at its initial value")
        _LOG.info("%s %s", save_path, what)
        return None

    restore.__wrapped__ = original  # type: ignore[attr-defined]
    return restore
