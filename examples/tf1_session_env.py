"""A plain TF1 training script: no tf_amp import, nothing mixed-precision in it.

Run it unchanged with the environment variable and it trains in mixed precision with dynamic
loss scaling (tf_amp's startup hook makes ``tf.compat.v1.Session`` run the rewritten graph and
routes ``optimizer.minimize`` through a loss-scaling optimizer)::

    python examples/tf1_session_env.py                                   # float32
    TF_ENABLE_AUTO_MIXED_PRECISION=1 python examples/tf1_session_env.py  # mixed precision
    TF_ENABLE_AUTO_MIXED_PRECISION=1 TF_AMP_LOG_PATH=/tmp/tf1_graphs \\
        python examples/tf1_session_env.py && tf-amp inspect /tmp/tf1_graphs

Data: scikit-learn's digits (ships with the package, nothing downloaded).
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

# No options: --help says what the script does instead of running it.
argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
).parse_args()

tf1 = tf.compat.v1
tf1.disable_eager_execution()


def conv2d(inputs, filters, name):
    with tf1.variable_scope(name):
        kernel = tf1.get_variable("kernel", [3, 3, inputs.shape[-1], filters])
        bias = tf1.get_variable("bias", [filters], initializer=tf1.zeros_initializer())
        return tf.nn.bias_add(tf.nn.conv2d(inputs, kernel, 1, "SAME"), bias)


def dense(inputs, units, name):
    with tf1.variable_scope(name):
        kernel = tf1.get_variable("kernel", [inputs.shape[-1], units])
        bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        return tf.matmul(inputs, kernel) + bias


def main() -> int:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.int32), test_size=0.2, random_state=0
    )
    tf1.set_random_seed(0)
    x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
    y = tf1.placeholder(tf.int32, [None], name="labels")
    net = tf.nn.relu(conv2d(x, 32, "conv1"))
    net = tf.nn.max_pool2d(net, 2, 2, "VALID")
    net = tf.reshape(net, [-1, 4 * 4 * 32])
    net = tf.nn.relu(dense(net, 64, "dense1"))
    logits = dense(net, 10, "logits")
    loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
    accuracy = tf.reduce_mean(
        tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.float32)
    )
    global_step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=global_step)
    saver = tf1.train.Saver()

    rng = np.random.default_rng(0)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for epoch in range(8):
            order = rng.permutation(len(x_train))
            for start in range(0, len(order), 32):
                batch = order[start : start + 32]
                _, loss_value = sess.run([train_op, loss], {x: x_train[batch], y: y_train[batch]})
            print(f"epoch {epoch + 1}: loss {loss_value:.4f}", flush=True)
        test_accuracy = sess.run(accuracy, {x: x_test, y: y_test})
        path = saver.save(sess, os.path.join(tempfile.mkdtemp(), "model"), global_step)
        print(f"session: {type(sess).__module__}.{type(sess).__name__}")
        print(f"steps: {sess.run(global_step)}  test accuracy: {test_accuracy:.4f}")
        print(f"checkpoint: {path}")
        print("variables:", ", ".join(v.op.name for v in tf1.global_variables()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
