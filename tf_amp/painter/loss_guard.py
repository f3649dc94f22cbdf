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

Which nodes: those under Keras 3's ``compile_loss`` name scope (a ``CompileLoss`` is a
``Loss`` named so), in the forward graph and in the gradient (``gradient_tape/compile_loss/``).
A loss the user computes in a custom ``train_step`` outside ``self.compute_loss`` has no such
scope; ``exclude_scopes`` keeps it float32.
"""

from __future__ import annotations

import re

from tf_amp.type_attrs import BodyView

_LOSS_SCOPE = re.compile(r"(?:^|/)compile_loss(?:_\d+)?/")


def compiled_loss_nodes(view: BodyView) -> list[int]:
    """Nodes of Keras's compiled loss and of its gradient."""
    return [n for n in range(view.num_real) if _LOSS_SCOPE.search(view.names[n])]
