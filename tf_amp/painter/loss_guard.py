"""The loss guard: a Keras 3 model's compiled loss, and its gradient, stay float32.

Keras computes losses in float32 under its mixed policies (a ``Loss`` casts its inputs to its
own dtype, float32), and NVIDIA's recipe does the same: a loss is a reduction over the batch
of logarithms and differences whose 16-bit rounding changes what it means. Painted as
TensorFlow's pass paints a Keras train step, a loss between the forward's and the backward's
MatMuls turns half through its passes 3 and 4, and the meaning goes: ``binary_crossentropy``
on probabilities clips them to ``[eps, 1 - eps]`` with ``eps = 1e-7``, and ``1 - 1e-7`` is
1.0 in both float16 and bfloat16, so ``log(1 - p)`` became ``log(0)`` once the model was
confident. Measured on a sigmoid model under ``TF_ENABLE_AUTO_MIXED_PRECISION``: the loss
turned NaN at the third epoch in bfloat16 (which has no loss scaling to skip the step, so the
weights became NaN) and float16 skipped step after step, where float32, Keras's
``mixed_float16`` and ``mixed_bfloat16`` all reached a loss of 0.034.

Which nodes:

- Keras 3: those under the ``compile_loss`` name scope (a ``CompileLoss`` is a ``Loss`` named
  so), in the forward graph and in the gradient (``gradient_tape/compile_loss/``);
- tf_keras (Keras 2): every ``Loss`` object, compiled or called in a custom ``train_step``,
  runs under a scope of its own name (``binary_crossentropy/``) and reduces through
  ``<scope>/weighted_loss/value``; the scopes that hold such a node, and their gradients,
  are the loss. Measured on the model above under tf_keras: float16 skipped every step from
  the fourth epoch on, stuck at twice float32's loss.

A Keras 3 loss the user computes in a custom ``train_step`` outside ``self.compute_loss`` has
no such scope; ``exclude_scopes`` keeps it float32.
"""

from __future__ import annotations

import re

from tf_amp.type_attrs import BodyView

_LOSS_SCOPE = re.compile(r"(?:^|/)compile_loss(?:_\d+)?/")
# tf_keras's losses_utils.compute_weighted_loss, under the Loss object's own scope.
_TF_KERAS_LOSS_VALUE = re.compile(r"^(.+/)weighted_loss/value$")
_GRADIENT = "gradient_tape/"


def compiled_loss_nodes(view: BodyView) -> list[int]:
    """Nodes of Keras's compiled loss (Keras 3) or of tf_keras's losses, and their gradients."""
    names = view.names[: view.num_real]
    scopes = _tf_keras_loss_scopes(names)
    if not scopes:
        return [n for n, name in enumerate(names) if _LOSS_SCOPE.search(name)]
    loss_scope = re.compile(
        "|".join([_LOSS_SCOPE.pattern]
                 + [rf"^(?:.*/)?(?:{_GRADIENT})?{re.escape(scope)}" for scope in scopes]))
    return [n for n, name in enumerate(names) if loss_scope.search(name)]


def _tf_keras_loss_scopes(names: list[str]) -> list[str]:
    """The scopes (``"binary_crossentropy/"``) of the tf_keras losses computed in a body."""
    scopes = set()
    for name in names:
        if not name.endswith("/weighted_loss/value"):  # a cheap test first: every node
            continue
        match = _TF_KERAS_LOSS_VALUE.match(name)
        if match and _GRADIENT not in name:
            scopes.add(match.group(1))
    return sorted(scopes)
