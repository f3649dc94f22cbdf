"""LossScaleOptimizer under tf.distribute: one replica's inf makes every replica skip.

Each scenario runs in a subprocess: logical CPU devices must be configured before TensorFlow
initialises its devices, and a multi-worker strategy owns the process; neither may leak into
the rest of the suite. The scripts assert on their own and print one JSON line of facts that
the test checks again.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMON = textwrap.dedent(
    """
    import json, os, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    {setup}
    import keras
    import tf_amp
    from tf_amp.loss_scale import DynamicLossScale

    POISON_STEPS = {{2: float("inf"), 5: float("nan"), 6: float("inf")}}
    x = tf.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3))
    y = tf.reduce_sum(x, axis=1, keepdims=True)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
        )
        opt = tf_amp.LossScaleOptimizer(
            keras.optimizers.Adam(0.01), DynamicLossScale(2.0**8, growth_interval=3)
        )
        opt.build(model.trainable_variables)

    @tf.function
    def step(bad):
        def replica_fn(bad):
            context = tf.distribute.get_replica_context()
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
                scaled = opt.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            # Only the last replica sees the inf/nan: the others must skip too.
            last = context.replica_id_in_sync_group == context.num_replicas_in_sync - 1
            poison = tf.where(last, bad, 0.0)
            opt.apply([g + poison for g in grads], model.trainable_variables)

        strategy.run(replica_fn, args=(bad,))

    def local(variable):
        variable = getattr(variable, "value", variable)
        values = strategy.experimental_local_results(variable)
        return [np.array(t.numpy()).tobytes() for t in values]

    def tracked():
        # weights + inner slots/iterations (what a skip keeps), and the loss-scale state
        return ([local(v) for v in model.weights + opt.inner_optimizer.variables],
                [local(v) for v in opt._state_vars])

    scales = []
    for i in range(8):
        before, _ = tracked()
        step(tf.constant(POISON_STEPS.get(i, 0.0)))
        after, state = tracked()
        for per_replica in after + state:
            assert len(set(per_replica)) == 1, "replicas diverged"
        if i in POISON_STEPS:
            assert before == after, f"step {{i}} was poisoned but state changed"
        else:
            assert before != after, f"step {{i}} was finite but nothing was applied"
        scales.append(float(opt.loss_scale))
    facts = {{
        "replicas": strategy.num_replicas_in_sync,
        "skipped": int(opt.skipped_steps),
        "iterations": int(strategy.experimental_local_results(opt.iterations.value)[0]),
        "scales": scales,
    }}
    """
)

MIRRORED_SETUP = textwrap.dedent(
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    """
)

MIRRORED_FIT = textwrap.dedent(
    """
    # fit() under the strategy takes the wrapper as well.
    with strategy.scope():
        fit_model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        fit_model.compile(optimizer=tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                          loss="mse")
    fit_model.fit(x.numpy(), y.numpy(), batch_size=4, epochs=2, verbose=0)
    iterations = fit_model.optimizer.iterations.value
    facts["fit_iterations"] = int(strategy.experimental_local_results(iterations)[0])
    print(json.dumps(facts))
    """
)


V1_PART = textwrap.dedent(
    """
    # The tf.compat.v1.train wrapper under the same strategy.
    with strategy.scope():
        v1_w = tf.Variable([1.0, 2.0])
        v1_gs = tf.Variable(
            0, dtype=tf.int64, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
        )
        v1_opt = tf_amp.LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))

    @tf.function
    def v1_step(bad):
        def replica_fn(bad):
            context = tf.distribute.get_replica_context()
            last = context.replica_id_in_sync_group == context.num_replicas_in_sync - 1
            poison = tf.where(last, bad, 0.0)
            loss = lambda: tf.reduce_sum(v1_w * v1_w) * (1.0 + poison)
            grads = v1_opt.compute_gradients(loss, var_list=[v1_w])
            v1_opt.apply_gradients(grads, global_step=v1_gs)

        strategy.run(replica_fn, args=(bad,))

    def per_replica(v):
        return [t.numpy().tolist() for t in strategy.experimental_local_results(v)]

    facts["v1"] = []
    for bad in [0.0, float("inf"), 0.0, float("nan")]:
        v1_step(tf.constant(bad))
        facts["v1"].append(
            {"w": per_replica(v1_w), "gs": per_replica(v1_gs),
             "scale": per_replica(v1_opt._state_vars[0])}
        )
    """
)

MULTI_WORKER_SETUP = textwrap.dedent(
    """
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    """
)

EXPECTED_SCALES = [256.0, 256.0, 128.0, 128.0, 128.0, 64.0, 32.0, 32.0]


TIMEOUT = 240  # seconds for one scenario (both workers together in the multi-worker ones)


def run_script(source: str, env: dict[str, str]) -> subprocess.Popen:
    full_env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **env)
    return subprocess.Popen(
        [sys.executable, "-c", source],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def facts_from(process: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"distributed script timed out:\n{err[-3000:]}")
    assert process.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def check(facts: dict) -> None:
    assert facts["replicas"] == 2
    assert facts["skipped"] == 3  # one per poisoned step, though only one replica saw it
    assert facts["iterations"] == 5
    assert facts["scales"] == EXPECTED_SCALES


def test_mirrored_strategy_two_logical_cpus():
    source = COMMON.format(setup=MIRRORED_SETUP) + V1_PART + MIRRORED_FIT
    facts = facts_from(run_script(source, {}), TIMEOUT)
    check(facts)
    check_v1(facts["v1"])
    assert facts["fit_iterations"] == 4


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_two_workers(source: str) -> list[dict]:
    """Runs ``source`` as the two workers of a local MultiWorkerMirroredStrategy cluster."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    workers = [
        run_script(
            source,
            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + TIMEOUT  # one budget for both: a dead peer must not double it
    try:
        return [facts_from(w, max(1.0, deadline - time.monotonic())) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()


def test_multi_worker_mirrored_strategy_two_local_workers():
    source = COMMON.format(setup=MULTI_WORKER_SETUP) + V1_PART + "\nprint(json.dumps(facts))\n"
    results = run_two_workers(source)
    for facts in results:
        check(facts)
        check_v1(facts["v1"])
    assert results[0] == results[1]


def check_v1(rows: list[dict]) -> None:
    for row in rows:
        for values in row.values():
            assert all(v == values[0] for v in values)  # local replicas agree
    assert rows[1]["w"] == rows[0]["w"] and rows[3]["w"] == rows[2]["w"]  # skipped
    assert rows[2]["w"] != rows[1]["w"]
    assert [r["gs"][0] for r in rows] == [1, 1, 2, 2]
    assert [r["scale"][0] for r in rows] == [32768.0, 16384.0, 16384.0, 8192.0]


ENV_CUSTOM_LOOP = textwrap.dedent(
    """
    import json, os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    {setup}
    import keras
    from tf_amp.runtime import activation, auto_loss_scale
    from tf_amp.runtime.activation import Settings

    # An unmodified custom loop (tape.gradient + apply_gradients, no scale_loss anywhere)
    # under the strategy, loss scaling switched on as TF_ENABLE_AUTO_MIXED_PRECISION does.
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            opt = keras.optimizers.SGD(0.1)
        x = tf.constant(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4))

        @tf.function
        def step(bad):
            def replica_fn():
                context = tf.distribute.get_replica_context()
                last = context.replica_id_in_sync_group == context.num_replicas_in_sync - 1
                factor = tf.where(tf.logical_and(bad, last), np.inf, 1.0)
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - 1.0)) * factor
                grads = tape.gradient(loss, model.trainable_variables)
                {aggregate}
                opt.apply_gradients(zip(grads, model.trainable_variables))

            strategy.run(replica_fn)

        def kernels():
            return [v.numpy().tobytes().hex() for v in model.layers[0].kernel.value.values]

        rows = []
        for bad in [False, True, False, True]:
            before = kernels()
            step(tf.constant(bad))
            after = kernels()
            with strategy.scope():  # the state is the strategy's
                scale = float(auto_loss_scale.current_state().scale)
            rows.append({{
                "kernels": after,
                "changed": before != after,
                "iterations": int(opt.iterations.numpy()),
                "scale": scale,
            }})
    print(json.dumps({{"replicas": strategy.num_replicas_in_sync, "rows": rows}}))
    """
)


def check_env_custom_loop(facts: dict) -> None:
    rows = facts["rows"]
    assert facts["replicas"] == 2
    assert all(len(set(row["kernels"])) == 1 for row in rows)  # local replicas agree
    assert [row["changed"] for row in rows] == [True, False, True, False]
    assert [row["iterations"] for row in rows] == [1, 1, 2, 2]
    assert [row["scale"] for row in rows] == [2.0**15, 2.0**14, 2.0**14, 2.0**13]


@pytest.mark.parametrize(
    "aggregate",
    [
        "",
        # The replicas meet at the all-reduce between tape.gradient and apply: the flags were
        # kept per graph, replica 0's apply took replica 1's, and replica 1's apply found none
        # ("Values to regroup had different lengths").
        'grads = context.all_reduce("MEAN", grads)',
    ],
)
def test_env_custom_loop_under_mirrored_strategy_skips_on_every_replica(aggregate):
    """The environment's custom-loop loss scaling under MirroredStrategy: the inner apply
    all-reduces gradients, so its skip cond must run in the cross-replica context (it used to
    fail with a merge_call error), and one replica's inf must make every replica skip."""
    source = ENV_CUSTOM_LOOP.format(setup=MIRRORED_SETUP, aggregate=aggregate)
    check_env_custom_loop(facts_from(run_script(source, {}), TIMEOUT))


REDUCED_OUTSIDE_THE_REPLICAS = textwrap.dedent(
    """
    import contextlib, json, os, warnings
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    {setup}
    import keras
    import tf_amp
    from tf_amp.runtime import activation, auto_loss_scale
    from tf_amp.runtime.activation import Settings

    # Gradients computed in strategy.run, reduced, and applied outside it (no scope).
    explicit = {explicit}
    env = activation.activated(Settings(graph_rewrite=False, loss_scaling=True))
    switch = contextlib.nullcontext() if explicit else env
    with switch, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            inner = keras.optimizers.SGD(0.1)
            opt = tf_amp.LossScaleOptimizer(inner) if explicit else inner
        x = tf.constant(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4))

        @tf.function
        def step(bad):
            def replica_fn():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - 1.0)) * tf.where(bad, np.inf, 1.0)
                    if explicit:
                        loss = opt.scale_loss(loss)
                return tape.gradient(loss, model.trainable_variables)

            grads = [strategy.reduce("MEAN", g, axis=None) for g in strategy.run(replica_fn)]
            opt.apply_gradients(zip(grads, model.trainable_variables))

        rows = []
        for bad in [False, True]:
            step(tf.constant(bad))
            with strategy.scope():
                scale = opt.loss_scale if explicit else auto_loss_scale.current_state().scale
            rows.append({{
                "finite": bool(np.isfinite(model.layers[0].kernel.numpy()).all()),
                "iterations": int(opt.iterations.numpy()),
                "scale": float(scale),
            }})
    not_scaled = [str(w.message) for w in seen if "not scaled" in str(w.message)]
    print(json.dumps({{"rows": rows, "not_scaled_warnings": not_scaled}}))
    """
)


@pytest.mark.parametrize("explicit", [False, True], ids=["environment", "wrapper"])
def test_gradients_reduced_and_applied_outside_the_replicas_skip_an_inf_step(explicit):
    """``strategy.run`` returns the gradients, ``strategy.reduce`` sums them and the apply runs
    outside the scope. The environment's apply found no flag of its own thread and applied
    the inf; and the skip cond, kept as one function call outside a strategy's scope, could
    not place the mirrored variables ("incompatible assigned devices"), the wrapper's too."""
    source = REDUCED_OUTSIDE_THE_REPLICAS.format(setup=MIRRORED_SETUP, explicit=explicit)
    facts = facts_from(run_script(source, {}), TIMEOUT)
    assert facts["rows"] == [
        {"finite": True, "iterations": 1, "scale": 2.0**15},
        {"finite": True, "iterations": 1, "scale": 2.0**14},
    ]
    # The replicas scaled the loss: an apply outside them must not say it was never scaled.
    assert facts["not_scaled_warnings"] == []


ENV_LOOPS_UNDER_SEVERAL_STRATEGIES = textwrap.dedent(
    """
    import json, os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    {setup}
    import keras
    from tf_amp.runtime import activation, auto_loss_scale
    from tf_amp.runtime.activation import Settings

    x = tf.constant(np.linspace(-0.1, 0.1, 16, dtype=np.float32).reshape(4, 4))
    phases = [("mirrored", strategy), ("one_device", tf.distribute.OneDeviceStrategy("/cpu:0")),
              ("none", tf.distribute.get_strategy())]
    facts = {{}}
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        for name, phase_strategy in phases:
            with phase_strategy.scope():
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
                opt = keras.optimizers.SGD(0.1)

                @tf.function
                def step():
                    def replica_fn():
                        with tf.GradientTape() as tape:
                            loss = tf.reduce_mean(tf.square(model(x) - 1.0))
                        grads = tape.gradient(loss, model.trainable_variables)
                        opt.apply_gradients(zip(grads, model.trainable_variables))

                    phase_strategy.run(replica_fn)

                for _ in range(3):
                    step()
                facts[name] = {{  # read in the scope: the state is the strategy's
                    "iterations": int(opt.iterations.numpy()),
                    "scale": float(auto_loss_scale.current_state().scale),
                }}
    print(json.dumps(facts))
    """
)


def test_env_custom_loops_under_one_strategy_then_another_each_keep_their_scale():
    """The environment's loop state was one set of variables per process, made under the first
    strategy (a MirroredVariable): a loop under OneDeviceStrategy then failed ("Mixing
    different tf.distribute.Strategy objects"), and one under none failed to place."""
    source = ENV_LOOPS_UNDER_SEVERAL_STRATEGIES.format(setup=MIRRORED_SETUP)
    facts = facts_from(run_script(source, {}), TIMEOUT)
    assert set(facts) == {"mirrored", "one_device", "none"}
    for name, phase in facts.items():
        assert phase == {"iterations": 3, "scale": 2.0**15}, name


def test_env_custom_loop_under_multi_worker_strategy_skips_on_every_worker():
    """Same loop on two worker processes: the worker whose gradients are finite must skip
    too, and both end with identical weights."""
    results = run_two_workers(ENV_CUSTOM_LOOP.format(setup=MULTI_WORKER_SETUP, aggregate=""))
    for facts in results:
        check_env_custom_loop(facts)
    assert results[0]["rows"] == results[1]["rows"]  # same weights on both workers


PREDICT_JIT_MIRRORED = textwrap.dedent(
    """
    import json, os
    os.environ["TF_AMP_TARGET_DTYPE"] = "float16"
    import numpy as np
    import tensorflow as tf
    {setup}
    import keras
    import tf_amp

    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01))
        model.compile(opt, loss="mse", jit_compile=True)
    got = model.predict(x, batch_size=4, verbose=0)
    want = x @ model.layers[0].kernel.numpy() + model.layers[0].bias.numpy()
    (step,) = model.__dict__["_tf_amp_steps"].values()
    (rebuilt,) = step.rewritten_concrete_functions()
    compiled = [
        f for f in rebuilt.graph.as_graph_def().library.function
        if f.attr["_XlaMustCompile"].b
    ]
    print(json.dumps({{
        "error": float(np.max(np.abs(got - want))),
        "compiled_functions": len(compiled),
        "half_in_compiled": all(
            any(n.op == "MatMul" and n.attr["T"].type == tf.float16.as_datatype_enum
                for n in f.node_def)
            for f in compiled
        ),
    }}))
    """
)


def test_predict_compiled_with_xla_under_mirrored_strategy_runs_each_replica_rewritten():
    """Keras compiles ``predict``'s per-replica step with XLA, inside ``strategy.run``.
    tf_amp compiled the rewritten step around it, one XLA computation reading every
    replica's variables: "TF variable on a different device". Now each replica calls the
    compiled step, rewritten."""
    facts = facts_from(run_script(PREDICT_JIT_MIRRORED.format(setup=MIRRORED_SETUP), {}), TIMEOUT)
    assert facts["error"] < 5e-3, facts
    assert facts["compiled_functions"] == 2 and facts["half_in_compiled"], facts


NESTED_IN_REPLICAS = textwrap.dedent(
    """
    import json, os, tempfile
    import numpy as np
    import tensorflow as tf
    {setup}
    import tf_amp
    from tensorflow.core.protobuf import saved_model_pb2

    with strategy.scope():
        w = tf.Variable(tf.ones([4, 4]) * 0.1)

    @tf.function
    def step(x):  # called in each replica's thread, inside the outer trace
        return tf.matmul(x, w)

    module = tf.Module()
    module.w = w
    module.outer = tf.function(
        lambda x: strategy.run(lambda a: step(a), args=(x,)),
        input_signature=[tf.TensorSpec([2, 4])],
    )
    result = module.outer(tf.ones([2, 4]))

    def half_nodes(graph_def):
        nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
        return sum(any(a.type == tf.float16.as_datatype_enum for a in n.attr.values())
                   for n in nodes)

    directory = tempfile.mkdtemp()
    tf.saved_model.save(module, directory)
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(directory, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    values = strategy.experimental_local_results(result)
    rewritten = module.outer.rewritten_concrete_functions()
    print(json.dumps({{
        "run_half": sum(half_nodes(f.graph.as_graph_def()) for f in rewritten),
        "trace_half": half_nodes(module.outer.get_concrete_function().graph.as_graph_def()),
        "saved_half": half_nodes(saved.meta_graphs[0].graph_def),
        "values": [float(np.sum(v)) for v in values],
    }}))
    """
)


def test_a_function_called_in_the_replicas_of_a_traced_function_is_part_of_its_trace():
    """MirroredStrategy runs each replica of the outer function's trace in a thread of its
    own, where tf_amp's tracing flag was down: the nested function was rewritten on its own
    inside the float32 trace, so a SavedModel exported under the environment held 8 float16
    nodes (and an outer tf_amp.function's config did not reach the nested call)."""
    environment = {"TF_ENABLE_AUTO_MIXED_PRECISION": "1", "TF_AMP_TARGET_DTYPE": "float16"}
    facts = facts_from(
        run_script(NESTED_IN_REPLICAS.format(setup=MIRRORED_SETUP), environment), TIMEOUT
    )
    assert facts["trace_half"] == 0 and facts["saved_half"] == 0, facts
    assert facts["run_half"] > 0, facts  # the outer rewrite covers the replicas' calls
    assert facts["values"] == [pytest.approx(3.2, rel=1e-3)] * 2, facts
