#!/usr/bin/env python3
"""Does XLA (`tf.function(jit_compile=True)`) help a grouped DCCO round here? Two measurements
(BUILD-notes, "Grouped simulation"; issue 18 asked for the try):

1. In this Python process: the centralized step's gradient (README demo model, DCCO 512 x 1's 512
   images, augmentations outside XLA) as a plain `tf.function` and XLA-compiled; best of 5 after 2.
2. Inside TFF's computations: DCCO's two client phases wrapped in XLA-compiled `tf.function`s (the
   serialized graph carries `_XlaMustCompile`), one grouped round's update compared with the plain
   process's. Bit-identical updates mean the worker ran the plain graph: XLA never engaged.

  .venv/bin/python tools/xla_check.py           # about 2 minutes on 2 cores
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl import runtime  # noqa: E402

runtime.install()  # Before TFF is imported: no orphan worker on any exit path.

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tff_ssl import data  # noqa: E402
from tff_ssl.benchmarks import common as bench  # noqa: E402
from tff_ssl.federated import common  # noqa: E402
from tff_ssl.methods import dcco  # noqa: E402
from tff_ssl.federated.functional import FunctionalModel  # noqa: E402


def centralized_steps(model, scenario, images, ids):
  loss_fn = scenario.loss_fn()

  def update(weights, v1, v2):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = loss_fn(*common.encode_views(model, weights, v1, v2))
    return [w - 1e-3 * g for w, g in zip(weights, tape.gradient(loss, weights))], loss

  def step_of(fn):
    @tf.function
    def step(weights, x, i, seed):
      v1, v2 = common.views({"images": x, "ids": i}, seed, bench.AUGMENT)
      return fn(list(weights), v1, v2)
    return step

  weights = [tf.constant(w) for w in model.initial_weights]
  seed = tf.constant([0, 1], tf.int64)
  out = {}
  for name, fn in (("plain", update),
                   ("xla", tf.function(update, jit_compile=True, autograph=False))):
    step = step_of(fn)
    out[name] = (bench.best_of(lambda step=step: step(weights, images, ids, seed)[1].numpy(),
                               warmup=2, repeats=5),
                 float(step(weights, images, ids, seed)[1]))
  return out


def xla_process(model, image_shape, scenario):
  """A grouped DCCO process whose two client phases are XLA-compiled `tf.function`s."""
  original_training, original_encode = dcco.train_against, common.encode_views
  dcco.train_against = tf.function(original_training, jit_compile=True, autograph=False)
  common.encode_views = tf.function(original_encode, jit_compile=True, autograph=False)
  try:
    return bench.build_process(scenario, model, image_shape)
  finally:
    dcco.train_against, common.encode_views = original_training, original_encode


def main() -> int:
  train = data.load("fashion_mnist", "train")
  scenario = bench.SCENARIOS["dcco_512x1"]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(bench.demo_model(train.image_shape))
  clients = bench.round_clients(train.images, scenario, 0)
  images = np.concatenate([c["images"] for c in clients])
  ids = np.concatenate([c["ids"] for c in clients])

  steps = centralized_steps(model, scenario, images, ids)
  for name, (seconds, loss) in steps.items():
    print(f"centralized step, {name:5s}: {seconds:.3f} s (loss {loss:.4f})")
  print(f"XLA / plain: {steps['xla'][0] / steps['plain'][0]:.2f}")

  updates = {}
  for name in ("plain", "xla"):
    process = (bench.build_process(scenario, model, train.image_shape)
               if name == "plain" else xla_process(model, train.image_shape, scenario))
    updates[name] = process.compute_update(process.initialize(), clients)
  diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(updates["plain"]["update"], updates["xla"]["update"]))
  print(f"grouped DCCO round in TFF: loss plain {float(updates['plain']['loss']):.6f}, "
        f"XLA-wrapped {float(updates['xla']['loss']):.6f}; max |update difference| {diff:.3g}"
        + (" (bit-identical: the TFF worker did not compile with XLA)" if diff == 0 else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
