"""Underflow rescue: a float16 model whose gradients flush to zero learns with dynamic scaling.

The model is a tiny 8-16-1 tanh regression whose layers compute in float16 (Keras
``mixed_float16`` per layer, float32 variables). The loss carries a weight of 1e-7, as a small
auxiliary loss or a loss averaged over a huge batch would: its gradient at the float16 output
is ~1e-9, below float16's smallest subnormal (6e-8), so without scaling every gradient is zero.
Adam (epsilon 1e-12) is invariant to the gradient magnitude, so float32 learns normally and the
comparison isolates underflow. Run this file directly to print the three loss curves.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import tf_amp

LOSS_WEIGHT = 1e-7
EPOCHS = 10


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    return x, np.tanh(x @ rng.normal(size=(8, 1))).astype("float32")


def train(dtype_policy: str, loss_scaling: bool) -> tuple[list[float], keras.Model, list]:
    """Returns the per-epoch loss (divided by the loss weight), the model, initial weights."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="tanh", dtype=dtype_policy),
            keras.layers.Dense(1, dtype=dtype_policy),
        ]
    )
    initial = [w.numpy().copy() for w in model.weights]
    optimizer = keras.optimizers.Adam(1e-2, epsilon=1e-12)
    if loss_scaling:
        optimizer = tf_amp.LossScaleOptimizer(optimizer)

    def weighted_mse(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
        return LOSS_WEIGHT * keras.losses.mean_squared_error(y_true, tf.cast(y_pred, "float32"))

    model.compile(optimizer=optimizer, loss=weighted_mse)
    x, y = dataset()
    history = model.fit(x, y, batch_size=32, epochs=EPOCHS, verbose=0, shuffle=False)
    return [loss / LOSS_WEIGHT for loss in history.history["loss"]], model, initial


def curves() -> dict[str, tuple[list[float], keras.Model, list]]:
    return {
        "float32": train("float32", False),
        "float16, no loss scaling": train("mixed_float16", False),
        "float16, dynamic loss scaling": train("mixed_float16", True),
    }


def test_dynamic_scaling_rescues_an_underflowing_float16_model():
    runs = curves()
    for name, (curve, _, _) in runs.items():
        print(f"{name:>30}: " + " ".join(f"{loss:.4f}" for loss in curve))
    fp32, _, _ = runs["float32"]
    unscaled, model16, initial16 = runs["float16, no loss scaling"]
    scaled, model_scaled, _ = runs["float16, dynamic loss scaling"]

    # Without scaling every gradient underflowed: not one weight moved, the loss is flat.
    assert all(
        a.tobytes() == w.numpy().tobytes() for a, w in zip(initial16, model16.weights, strict=True)
    )
    assert max(unscaled) - min(unscaled) < 1e-6 * max(unscaled)
    # With dynamic scaling float16 learns like float32.
    assert fp32[-1] < 0.15 * fp32[0]
    assert scaled[-1] < 0.15 * unscaled[0]
    np.testing.assert_allclose(scaled, fp32, rtol=0.05)
    optimizer = model_scaled.optimizer
    assert int(optimizer.skipped_steps) == 0 and float(optimizer.loss_scale) == 2.0**15


if __name__ == "__main__":
    test_dynamic_scaling_rescues_an_underflowing_float16_model()
