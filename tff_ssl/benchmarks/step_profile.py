"""Where a training step's time goes, by op type: `bin/benchmark --step_profile`.

One centralized SGD step of the scenario's SSL loss (both views in one forward pass, as the rounds
compute them) is traced with `tf.profiler`, and each TensorFlow op's time on the host's compute
threads is summed by op type and by kind: convolutions (forward and both backward passes), matrix
products, casts, and the rest (normalization, activations, the loss, the augmentations, the update).
Op times are summed over threads, so with 2 cores they add up to more than the step's wall time.
"""

from __future__ import annotations

import collections
import glob
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

from tff_ssl.benchmarks.common import AUGMENT, Scenario, with_precision
from tff_ssl.federated import common
from tff_ssl.federated.functional import FunctionalModel

PROFILE_FIELDS = ("precision", "batch", "step_s", "op_ms", "convolution_ms", "matmul_ms", "cast_ms",
                  "other_ms", "top_ops")


def kind(op_type: str) -> str:
  """The kind of an op type: convolution, matmul, cast or other."""
  if "Conv2D" in op_type:
    return "convolution"
  if "MatMul" in op_type or op_type in ("Einsum", "BatchMatMulV2"):
    return "matmul"
  return "cast" if op_type == "Cast" else "other"


def op_times(logdir: str) -> collections.Counter:
  """Op type -> total ms of its TensorFlow ops on the compute threads of the profile in `logdir`."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    raise RuntimeError(f"tf.profiler wrote no trace under {logdir}")
  totals = collections.Counter()
  for path in paths:
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      for line in plane.lines:
        if not line.name.startswith("tf_"):  # The executor's threads ("tf_Compute/...").
          continue
        for event in line.events:
          meta = plane.event_metadata[event.metadata_id]
          if ":" in meta.name and meta.display_name:  # A TF op: "name:Type", shown as its type.
            totals[meta.display_name] += event.duration_ps / 1e9
  return totals


def profile_step(images: np.ndarray, model_builder, *, precision: str, ssl: str = "cco",
                 repeats: int = 5, profiled: int = 3, top: int = 12) -> dict:
  """A step on `images` (its batch) with `ssl`'s loss: the median step time over `repeats` steps
  after one untimed step, then the op table of `profiled` more steps (per step). Returns a row of
  `PROFILE_FIELDS`."""
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(with_precision(model_builder, precision))
  n = len(images)
  loss_fn = Scenario("step", "dcco", n, 1, ssl=ssl).loss_fn()
  x = images
  ids = np.arange(n, dtype=np.int64)
  weights = [tf.Variable(w) for w in model.initial_weights]

  @tf.function
  def step(seed):
    v1, v2 = common.views({"images": x, "ids": ids}, seed, AUGMENT)
    with tf.GradientTape() as tape:
      f, g = common.encode_views(model, [w.read_value() for w in weights], v1, v2)
      loss = loss_fn(f, g)
    for w, grad in zip(weights, tape.gradient(loss, weights)):
      w.assign_sub(1e-3 * grad)
    return loss

  float(step(tf.constant([0, 0], tf.int64)))
  times = []
  for r in range(1, repeats + 1):
    start = time.perf_counter()
    float(step(tf.constant([0, r], tf.int64)))
    times.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    try:
      for r in range(profiled):
        float(step(tf.constant([1, r], tf.int64)))
    finally:
      tf.profiler.experimental.stop()
    totals = op_times(logdir)
  per_step = {op: ms / profiled for op, ms in totals.items()}
  kinds = collections.Counter()
  for op, ms in per_step.items():
    kinds[kind(op)] += ms
  ranked = sorted(per_step.items(), key=lambda item: -item[1])[:top]
  return {"precision": precision, "batch": n, "step_s": float(np.median(times)),
          "op_ms": sum(per_step.values()),
          **{f"{k}_ms": kinds[k] for k in ("convolution", "matmul", "cast", "other")},
          "top_ops": "; ".join(f"{op} {ms:.1f}" for op, ms in ranked)}


def format_profile(rows: list[dict]) -> str:
  """The op table: one column per profiled step (precision), ms per step."""
  header = "| ms a step | " + " | ".join(r["precision"] for r in rows) + " |"
  lines = [header, "|---|" + "---|" * len(rows),
           "| step (wall, median) | " + " | ".join(f"{1e3 * r['step_s']:.0f}" for r in rows) + " |",
           "| ops (sum over threads) | " + " | ".join(f"{r['op_ms']:.0f}" for r in rows) + " |"]
  for k in ("convolution", "matmul", "cast", "other"):
    lines.append(f"| {k} | " + " | ".join(
        f"{r[f'{k}_ms']:.0f} ({100 * r[f'{k}_ms'] / r['op_ms']:.0f}%)" for r in rows) + " |")
  for r in rows:
    lines.append(f"\n{r['precision']}, the costliest op types (ms a step): {r['top_ops']}")
  return "\n".join(lines)
