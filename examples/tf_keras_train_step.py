"""An unmodified tf.keras 2.x script with its own ``train_step`` (Keras 2 through tf_keras).

The pattern of the "customizing what happens in fit" guide: the step computes the loss under a
``tf.GradientTape`` and calls ``self.optimizer.apply_gradients``. Nothing mentions tf_amp::

    TF_USE_LEGACY_KERAS=1 TF_ENABLE_AUTO_MIXED_PRECISION=1 python examples/tf_keras_train_step.py

Under the variable the step runs rewritten, its ``tape.gradient`` is loss-scaled and a step whose
gradients overflow is skipped. Data: scikit-learn's digits.
"""

import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

# No options: --help says what the script does instead of running it.
argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
).parse_args()


class Classifier(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.conv = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu")
        self.flatten = tf.keras.layers.Flatten()
        self.hidden = tf.keras.layers.Dense(64, activation="relu")
        self.logits = tf.keras.layers.Dense(10)
        self.loss_tracker = tf.keras.metrics.Mean(name="loss")

    def call(self, x, training=False):
        return self.logits(self.hidden(self.flatten(self.conv(x))))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


digits = load_digits()
x = (digits.images / 16.0).astype(np.float32)[..., None]
y = digits.target.astype(np.int32)

tf.keras.utils.set_random_seed(0)
model = Classifier()
model.compile(
    optimizer=tf.keras.optimizers.Adam(2e-3),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
print("keras:", type(model).__mro__[1].__module__.split(".")[0])
print("optimizer:", type(model.optimizer).__name__)
print("losses:", history.history["loss"])
accuracy = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))
print("accuracy:", accuracy)
print("iterations:", int(model.optimizer.iterations))
