"""An unmodified tf.keras 2.x custom loop: ``tf.GradientTape`` in a ``tf.function``.

A bag-of-words Embedding classifier (its gradient is sparse: ``tf.IndexedSlices``) trained with
a legacy tf_keras optimizer. Nothing mentions tf_amp::

    TF_USE_LEGACY_KERAS=1 TF_ENABLE_AUTO_MIXED_PRECISION=1 python examples/tf_keras_tape_loop.py

Under the variable the step runs rewritten, ``tape.gradient`` is loss-scaled, and
``apply_gradients`` skips a step whose gradients overflow. Data: synthetic token sequences
whose label is the parity of how many "odd" tokens they hold more than "even" ones.
"""

import argparse

import numpy as np
import tensorflow as tf

# No options: --help says what the script does instead of running it.
argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
).parse_args()

rng = np.random.default_rng(0)
tokens = rng.integers(1, 200, size=(512, 12)).astype(np.int32)
labels = (np.sum(tokens < 100, axis=1) > 6).astype(np.int32)

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential(
    [
        tf.keras.layers.Embedding(200, 32, input_length=12),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(2),
    ]
)
optimizer = tf.keras.optimizers.legacy.Adam(1e-2)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
dataset = tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(64)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


losses = []
for _ in range(8):
    epoch = [float(train_step(x, y)) for x, y in dataset]
    losses.append(sum(epoch) / len(epoch))
print("keras:", type(model).__module__.split(".")[0])
print("optimizer:", type(optimizer).__name__)
print("losses:", losses)
print("iterations:", int(optimizer.iterations))
