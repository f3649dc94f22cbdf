"""A custom training loop in mixed precision with ``tf_amp.function``.

``@tf_amp.function`` replaces ``@tf.function``: the traced step is rewritten to the reduced
precision that is fast here (float16 on a CUDA GPU, bfloat16 on a CPU with AMX-BF16 or
AVX512-BF16; elsewhere it stays float32, and says why; ``TF_AMP_TARGET_DTYPE=float16`` forces
one) and runs on the same variables. The optimizer from ``enable_mixed_precision_graph_rewrite``
scales the loss and skips steps whose gradients overflow, where the target needs it (float16)::

    python examples/custom_loop.py

Data: scikit-learn's digits (ships with the package, nothing downloaded).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 10, "Epochs.")
flags.DEFINE_integer("batch_size", 32, "Batch size.")


def main(argv: list[str]) -> int:
    del argv
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import tf_amp

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.int32), test_size=0.2, random_state=0
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    optimizer = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(2e-3))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf_amp.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled_loss = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf_amp.function
    def accuracy(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        predicted = tf.argmax(model(x, training=False), axis=1, output_type=tf.int32)
        return tf.reduce_mean(tf.cast(tf.equal(predicted, y), tf.float32))

    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=0)
        .batch(FLAGS.batch_size, drop_remainder=True)
    )
    progress = keras.utils.Progbar(FLAGS.epochs, stateful_metrics=["loss"])
    for epoch in range(FLAGS.epochs):
        for x, y in dataset:
            loss = train_step(x, y)
        progress.update(epoch + 1, [("loss", float(loss))])

    print(f"test accuracy: {float(accuracy(x_test, y_test)):.4f}")
    print(train_step.reports[0].summary_line())  # with a float32 target: why nothing changed
    print(
        f"loss scale: {float(optimizer.loss_scale):g}  skipped steps: "
        f"{int(optimizer.skipped_steps)}  optimizer steps: {int(optimizer.iterations)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
