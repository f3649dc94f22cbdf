"""An unmodified tf.keras 2.x ``fit`` script (Keras 2 through tf_keras), for the env path.

Nothing here mentions tf_amp. Run it as a Keras 2 user does, plus the one variable::

    TF_USE_LEGACY_KERAS=1 TF_ENABLE_AUTO_MIXED_PRECISION=1 python examples/tf_keras_fit.py

With tf_amp installed, ``fit`` runs the rewritten (mixed-precision) train step and the optimizer
is loss-scaled; without the variable it trains in float32. Data: scikit-learn's digits.
"""

import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

# No options: --help says what the script does instead of running it.
argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
).parse_args()

digits = load_digits()
x = (digits.images / 16.0).astype(np.float32)[..., None]
y = digits.target.astype(np.int32)

tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential(
    [
        tf.keras.layers.Conv2D(16, 3, padding="same", input_shape=(8, 8, 1)),
        tf.keras.layers.BatchNormalization(),
        tf.keras.layers.ReLU(),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ]
)
model.compile(
    optimizer=tf.keras.optimizers.Adam(2e-3),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
print("keras:", type(model).__module__.split(".")[0])
print("optimizer:", type(model.optimizer).__name__)
print("losses:", history.history["loss"])
print("accuracy:", model.evaluate(x, y, verbose=0)[1])
print("predictions:", model.predict(x[:8], verbose=0).dtype)
print("iterations:", int(model.optimizer.iterations))
