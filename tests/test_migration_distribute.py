"""Loss scaling under a MirroredStrategy on 2 logical CPUs, a fresh strategy per scenario.

The scenarios of tf-keras's strategy tests (``loss_scale_optimizer_test.py``) in our own words,
plus issue 16's bug: a new strategy after switching from eager to ``tf.function`` aborted the
process's collectives. Logical devices must be configured before TensorFlow starts, so all
scenarios run in one subprocess (one TensorFlow start for all: they are slow); each builds its
own strategy, variables and optimizer, records facts, and a failure in one is recorded as its
error without stopping the others. The collective bug poisons every later collective, so that
scenario runs last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(
    """
    import json, os, traceback
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    import keras
    import tf_amp

    def fresh():
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def local(strategy, value):
        # every replica's copy of the value, as lists (all must agree)
        if isinstance(value, keras.Variable):
            value = value.value
        return [t.numpy().tolist() for t in strategy.experimental_local_results(value)]

    def keras3_step(opt, var, loss_fn):
        def step():
            with tf.GradientTape() as tape:
                loss = opt.scale_loss(loss_fn())
            opt.apply(tape.gradient(loss, [var]), [var])
        return step

    SCENARIOS = {}

    def scenario(fn):
        SCENARIOS[fn.__name__] = fn
        return fn

    # SCENARIOS

    facts = {}
    for name, fn in SCENARIOS.items():
        try:
            facts[name] = fn()
        except Exception:
            facts[name] = {"error": traceback.format_exc()[-2500:]}
    print(json.dumps(facts))
    """
)

EAGER_THEN_FUNCTION = '''
@scenario
def eager_then_function_with_fresh_strategies():
    """Issue 16, bug 1: strategy.run eagerly, then a new strategy inside a tf.function."""
    out = {}
    for mode in ("eager", "function"):
        strategy = fresh()
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_amp.LossScaleOptimizer(
                keras.optimizers.SGD(2.0), dynamic=False, initial_scale=10
            )
            opt.build([var])
        step = keras3_step(opt, var, lambda: tf.reduce_sum(var) / 2.0)
        if mode == "eager":
            strategy.run(step)
        else:
            tf.function(lambda: strategy.run(step))()
        out[mode] = local(strategy, var)
    return out
'''


SCENARIOS = [EAGER_THEN_FUNCTION]  # the collective bug last: it poisons later collectives


@pytest.fixture(scope="module")
def facts() -> dict:
    source = SCRIPT.replace("# SCENARIOS", "\n".join(SCENARIOS))
    done = subprocess.run(
        [sys.executable, "-c", source],
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def result(facts: dict, name: str) -> dict:
    got = facts[name]
    assert "error" not in got, got.get("error")
    return got


def test_a_fresh_strategy_after_eager_then_tf_function_still_runs_collectives(facts):
    # true gradient 1/2 per replica, summed over 2 replicas: 1; lr 2: each step moves by -2
    got = result(facts, "eager_then_function_with_fresh_strategies")
    assert got["eager"] == [[-1.0, 0.0], [-1.0, 0.0]]
    assert got["function"] == [[-1.0, 0.0], [-1.0, 0.0]]
