"""TensorFlow's real GPU ``auto_mixed_precision`` pass on a machine without a GPU.

Run by ``tests/_gpu_oracle.py`` as a script with the interpreter of ``.venv-tf-gpu`` (the CUDA
build of TensorFlow 2.21, made by ``scripts/make_oracle_venv.sh``), never imported by tf_amp:
it needs nothing but TensorFlow, so nothing of tf_amp is installed in that environment.

Why this works without a GPU: Grappler's pass asks the *cluster* for its devices, not the
machine. A virtual ``gcluster.Cluster`` holding a GPU whose properties say compute capability
8.0 makes the CUDA-mode pass run its full pipeline (its log says "Beginning pass 4 ...") and
Tensor-Core ops turn half. The CPU wheel cannot do this: it is built without CUDA, so its
``auto_mixed_precision`` pass (the CUDA mode) is compiled out.

Usage: ``python _gpu_oracle_runner.py SPEC.json``, where SPEC has ``graph`` (a binary GraphDef
file), ``out`` (where to write the rewritten GraphDef), ``fetches`` (node names to preserve),
and optionally ``architecture``, ``cuda_version``, ``cudnn_version``, ``optimizer``, and
``with_gpu`` (false: a cluster with only a CPU, as a control).
"""

from __future__ import annotations

import json
import sys

GPU_DEVICE = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


def main(spec_path: str) -> None:
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import (
        config_pb2,
        device_properties_pb2,
        meta_graph_pb2,
        rewriter_config_pb2,
    )
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import tf_optimizer

    with open(spec_path) as f:
        spec = json.load(f)
    graph_def = graph_pb2.GraphDef()
    with open(spec["graph"], "rb") as f:
        graph_def.ParseFromString(f.read())
    # Every node on the GPU, as the placer would put a GPU training step; TensorFlow's pass
    # only considers nodes whose (virtually placed) device is a GPU.
    for node in graph_def.node:
        node.device = "/device:GPU:0"
    for function in graph_def.library.function:
        for node in function.node_def:
            node.device = "/device:GPU:0"

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(sorted(set(spec["fetches"])))
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend([spec.get("optimizer", "auto_mixed_precision")])
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE

    gpu = device_properties_pb2.DeviceProperties(
        type="GPU",
        vendor="NVIDIA",
        model="virtual",
        frequency=1410,
        num_cores=108,
        # The keys TensorFlow's pass reads (GetCudaVersion / GetCudnnVersion look up "cuda"
        # and "cudnn", as a real GPU's properties fill them): with the CUDA version unknown
        # the pass keeps BatchMatMul float32 ("slow before CUDA 9.1"), with cuDNN unknown
        # DepthwiseConv2dNative and Conv3D. The values are TensorFlow 2.21's build: CUDA
        # 12.5, cuDNN 9.3.
        environment={
            "architecture": spec.get("architecture", "8.0"),
            "cuda": spec.get("cuda_version", "12050"),
            "cudnn": spec.get("cudnn_version", "90300"),
        },
        memory_size=40 * 1024**3,
    )
    cpu = device_properties_pb2.DeviceProperties(type="CPU", frequency=2000, num_cores=2)
    devices = [device_properties_pb2.NamedDevice(name=CPU_DEVICE, properties=cpu)]
    if spec.get("with_gpu", True):
        devices.append(device_properties_pb2.NamedDevice(name=GPU_DEVICE, properties=gpu))
    cluster = gcluster.Cluster(devices=devices)
    out = tf_optimizer.OptimizeGraph(config, meta, verbose=False, cluster=cluster)
    with open(spec["out"], "wb") as f:
        f.write(out.SerializeToString())


if __name__ == "__main__":
    main(sys.argv[1])
