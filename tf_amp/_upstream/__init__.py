"""The one door to TensorFlow's and Keras's internals.

tf_amp runs a graph rewrite that TensorFlow 2 has no public hook for, so some of its work needs
symbols that are not part of TensorFlow's or Keras's public API. Every such symbol is imported
here and nowhere else, one module per upstream:

* :mod:`tf_amp._upstream.tensorflow` -- ``tensorflow.python.*``;
* :mod:`tf_amp._upstream.keras` -- ``keras.src.*``;
* :mod:`tf_amp._upstream.versions` -- the supported release range, checked when either of the
  two is first imported (standard library only, so it can run before TensorFlow is loaded).

Each module says, per symbol, why the public API does not do. When a new TensorFlow or Keras
release moves one of them, this is the place to look; a release outside the tested range is
refused with one error that names the range, instead of an AttributeError deep inside a
training step.

The generated protobuf modules (``tensorflow.core.framework.graph_pb2`` and friends) are not
routed through here: they are TensorFlow's serialization schema (the GraphDef and SavedModel
file formats), which TensorFlow keeps compatible across releases, not implementation code.

Importing this package imports nothing.
"""
