"""Runtime adapters: run the mixed-precision rewrite of graphs users already build.

TensorFlow 2 offers no hook to run a Python rewrite inside Grappler, so each way in rewrites the
graph itself and runs the result. The modules form a stack; each imports only modules below it
(``tests/test_import_graph.py`` checks that there is no cycle):

* top, the two switches: :mod:`tf_amp.runtime.activation` (``TF_ENABLE_AUTO_MIXED_PRECISION``;
  :mod:`~tf_amp.runtime.autoenable` is what the startup ``.pth`` imports, and
  :mod:`~tf_amp.runtime.hook_install` puts that ``.pth`` into site-packages by hand) and
  :mod:`tf_amp.enable` (``enable_mixed_precision_graph_rewrite``);
* loss scaling for scripts that never asked for it (activation only):
  :mod:`~tf_amp.runtime.auto_loss_scale` (custom loops), :mod:`~tf_amp.runtime.auto_loss_scale_v1`
  (TF1 optimizers and ``Saver``), :mod:`~tf_amp.runtime.auto_loss_scale_fit` (Keras ``fit``);
  these use the optimizer wrappers (:mod:`tf_amp.optimizers`), which sit below them;
* :mod:`~tf_amp.runtime.rewrite_switch` -- marks an optimizer and installs the Keras compile
  hook (also reached from a loaded, marked Keras wrapper);
* tf_keras under the environment: :mod:`~tf_amp.runtime.tf_keras_env` (its patches);
  :mod:`~tf_amp.runtime._user_callers` says whether a patched method was called by user code
  (AutoGraph's frames skipped), :mod:`~tf_amp.runtime._own_train_step` whether a model steps
  with a ``train_step`` of its own (then its optimizer is not wrapped at ``compile``);
* the adapters, which know nothing of loss scaling: :mod:`~tf_amp.runtime.keras_fit` (the
  compile hook and per-model install) over :mod:`~tf_amp.runtime.keras_steps` (the rewritten
  fit / evaluate / predict steps), :mod:`~tf_amp.runtime.tf_keras_fit` (the same for tf_keras's
  step builders), :mod:`~tf_amp.runtime.function` (``tf_amp.function``) over
  :mod:`~tf_amp.runtime._rebuild` (traced graph -> rewritten concrete function),
  :mod:`~tf_amp.runtime.session` (``tf_amp.Session``), all over
  :mod:`~tf_amp.runtime._graphdef` (inline, rewrite, rename library functions);
* the bottom, importing no TensorFlow at module level: :mod:`~tf_amp.runtime.settings` (the
  environment variables; the target is resolved on first question),
  :mod:`~tf_amp.runtime._post_import` (patch a module right after its import),
  :mod:`~tf_amp.runtime._patches` (the one patch registry both switches use) and
  :mod:`~tf_amp.runtime._state` (the switches' shared state); the last three import nothing of
  tf_amp.

Private TensorFlow and Keras symbols come from :mod:`tf_amp._upstream` only.

Submodules are imported on demand; importing this package imports nothing heavy.
"""
