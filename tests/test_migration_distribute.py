"""Loss scaling under a MirroredStrategy on 2 logical CPUs, a fresh strategy per scenario.

The scenarios of tf-keras's strategy tests (``loss_scale_optimizer_test.py``) in our own words,
plus issue 16's bug: a new strategy after switching from eager to ``tf.function`` aborted the
process's collectives. Logical devices must be configured before TensorFlow starts, so each
scenario runs in a subprocess of its own (all started at once); each builds fresh strategies,
variables and optimizers and prints its facts, or its error, as one JSON line.
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
    import numpy as np
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

    import sys
    name = sys.argv[1]
    try:
        facts = SCENARIOS[name]()
    except Exception:
        facts = {"error": traceback.format_exc()[-2500:]}
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


TF_KERAS_PORTS = '''
def run_both(step):
    """tf-keras ran each scenario eagerly and in a tf.function: both, each a fresh strategy."""
    out = {}
    for mode in ("eager", "function"):
        strategy = fresh()
        out[mode] = step(strategy, mode)
    return out

def run(strategy, mode, fn):
    if mode == "eager":
        strategy.run(fn)
    else:
        tf.function(lambda: strategy.run(fn))()

@scenario
def dynamic_update():
    """tf-keras testDynamicUpdate: finite step applies and grows, a NaN step skips and halves."""
    def body(strategy, mode):
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_amp.LossScaleOptimizer(
                keras.optimizers.SGD(1.0), initial_scale=2, dynamic_growth_steps=1
            )
            opt.build([var])
        run(strategy, mode, keras3_step(opt, var, lambda: tf.reduce_sum(var) * 2.0 / 2))
        after_finite = (local(strategy, var), float(opt.loss_scale))
        run(strategy, mode, keras3_step(opt, var, lambda: tf.reduce_sum(var) * float("nan")))
        return [after_finite, (local(strategy, var), float(opt.loss_scale))]
    return run_both(body)

@scenario
def nan_on_one_replica_only():
    """tf-keras testNanOnOneReplicaOnly (there GPU-only): every replica skips."""
    def body(strategy, mode):
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_amp.LossScaleOptimizer(
                keras.optimizers.SGD(1.0), initial_scale=2, dynamic_growth_steps=2
            )
            opt.build([var])
        def loss():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            factor = tf.where(tf.equal(replica, 0), tf.constant([2.0, 2.0]),
                              tf.constant([1.0, float("nan")]))
            return tf.reduce_sum(var * factor)
        run(strategy, mode, keras3_step(opt, var, loss))
        return [local(strategy, var), float(opt.loss_scale)]
    return run_both(body)

@scenario
def clipping_on_the_inner_optimizer():
    """tf-keras testClipping: clipping sees the unscaled gradient; inf still skips."""
    out = {}
    for clip in ("clipnorm", "global_clipnorm", "clipvalue"):
        strategy = fresh()
        with strategy.scope():
            var = tf.Variable([5.0])
            opt = tf_amp.LossScaleOptimizer(
                keras.optimizers.SGD(2.0, **{clip: 2.0}), initial_scale=2,
                dynamic_growth_steps=1,
            )
            opt.build([var])
        run(strategy, "function", keras3_step(opt, var, lambda: tf.reduce_sum(var) * 4))
        first = (local(strategy, var), float(opt.loss_scale))
        run(strategy, "function", keras3_step(opt, var, lambda: tf.reduce_sum(var) * np.inf))
        out[clip] = [first, (local(strategy, var), float(opt.loss_scale))]
    return out
'''

SCENARIOS = [TF_KERAS_PORTS, EAGER_THEN_FUNCTION]


NAMES = [
    "dynamic_update",
    "nan_on_one_replica_only",
    "clipping_on_the_inner_optimizer",
    "eager_then_function_with_fresh_strategies",
]


@pytest.fixture(scope="module")
def facts() -> dict:
    """Each scenario in a process of its own, all started at once. Why not one process: the
    strategies of one process reuse collective instance keys, and TensorFlow keeps the shape
    an instance first had, so scenarios reducing different shapes would trip each other."""
    return run_scenarios("\n".join(SCENARIOS), NAMES)


def run_scenarios(scenarios: str, names: list[str]) -> dict:
    """Runs each named scenario of ``scenarios`` (source defining ``@scenario`` functions) in
    a process of its own, all at once; returns each one's facts (or its ``error``)."""
    source = SCRIPT.replace("# SCENARIOS", scenarios)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    running = {
        name: subprocess.Popen(
            [sys.executable, "-c", source, name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    }
    found = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-4000:]
        found[name] = json.loads(out.strip().splitlines()[-1])
    return found


def result(facts: dict, name: str) -> dict:
    got = facts[name]
    assert "error" not in got, got.get("error")
    return got


def test_a_fresh_strategy_after_eager_then_tf_function_still_runs_collectives(facts):
    # true gradient 1/2 per replica, summed over 2 replicas: 1; lr 2: each step moves by -2
    got = result(facts, "eager_then_function_with_fresh_strategies")
    assert got["eager"] == [[-1.0, 0.0], [-1.0, 0.0]]
    assert got["function"] == [[-1.0, 0.0], [-1.0, 0.0]]


def test_tf_keras_dynamic_update_under_mirrored_strategy(facts):
    got = result(facts, "dynamic_update")
    for mode in ("eager", "function"):
        # gradient 1 per replica, summed: 2; lr 1. Then NaN: no change, scale halves.
        assert got[mode] == [[[[-1.0, 0.0]] * 2, 4.0], [[[-1.0, 0.0]] * 2, 2.0]]


def test_tf_keras_nan_on_one_replica_skips_every_replica(facts):
    got = result(facts, "nan_on_one_replica_only")
    for mode in ("eager", "function"):
        assert got[mode] == [[[1.0, 2.0]] * 2, 1.0]


def test_tf_keras_clipping_under_mirrored_strategy(facts):
    got = result(facts, "clipping_on_the_inner_optimizer")
    for clip in ("clipnorm", "global_clipnorm", "clipvalue"):
        # Each replica's gradient 4 clipped to 2, then summed: 4; lr 2: 5 -> -3; scale 2 -> 4.
        # (Keras 3 optimizers clip per replica before summing, tf.keras clipped the sum: the
        # inner optimizer's behaviour, which tf_amp leaves as it is.) Inf: skipped, 4 -> 2.
        assert got[clip] == [[[[-3.0]] * 2, 4.0], [[[-3.0]] * 2, 2.0]], clip
