"""Round-time benchmark: reference vs grouped simulation vs the centralized equivalent, in one process.

For each scenario (`common.SCENARIOS`) the same images are trained three ways, each timed over
`rounds` rounds after `warmup` untimed ones (tracing, the TFF worker's start), and the median round
time is reported:

  reference   one real client per TFF client slot (`grouping.Simulation(mode="reference")`)
  grouped     the round's clients packed into TFF client slots (the default mode)
  baseline    what the round should cost without federation: one centralized SGD step on the union
              of the round's images (one-local-step scenarios), or plain sequential local training of
              the same clients, one compiled `tf.function` per client call (cross-silo); for a
              private round, the same clients' round without privacy (grouped, `non_private`)

and the ratios reference/baseline and grouped/baseline. Peak resident memory is that of this process
and of the TFF worker process (`worker_binary`), which holds the round's tensors while it runs.
`profile_grouped_dcco` breaks a grouped DCCO round down (`bin/benchmark --profile`).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.benchmarks.common import (AUGMENT, Scenario, best_of, build_process, median_time,
                                       peak_rss_mb, ratio, round_clients, with_precision)
from tff_ssl.federated import common, grouping
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.methods import dcco as dcco_lib
from tff_ssl.methods import dcco_term

FIELDS = ("scenario", "precision", "images_per_round", "reference_s", "grouped_s", "baseline",
          "baseline_s", "baseline_xla_s", "reference_ratio", "grouped_ratio", "peak_rss_python_mb",
          "peak_rss_worker_mb")


def _centralized_step(model: FunctionalModel, scenario: Scenario, jit_compile: bool = False):
  """One SGD step of the within-batch loss on the union of the round's images (`jit_compile`: the
  model's forward and backward pass compiled by XLA; the augmentation, whose crops XLA cannot
  compile, stays a graph)."""
  loss_fn = scenario.loss_fn()

  @tf.function(jit_compile=jit_compile)
  def loss_and_grads(weights, v1, v2):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      f, g = common.encode_views(model, weights, v1, v2)
      loss = loss_fn(f, g)
    return loss, tape.gradient(loss, weights)

  @tf.function
  def step(weights, images, ids, seed):
    v1, v2 = common.views({"images": images, "ids": ids}, seed, AUGMENT)
    loss, grads = loss_and_grads(weights, v1, v2)
    return [w - 1e-3 * gr for w, gr in zip(weights, grads)], loss

  return step


def _sequential_training(model: FunctionalModel, scenario: Scenario):
  """One client's local training (its local steps of plain gradient descent at the scenario's client
  learning rate), compiled once and called per client."""
  loss_fn = scenario.loss_fn()
  learning_rate = scenario.client_learning_rate

  @tf.function
  def train(weights, images, ids, seed):
    current = list(weights)
    for s in range(scenario.local_steps):
      step_seed = seed if s == 0 else tf.random.experimental.stateless_fold_in(seed, s)
      v1, v2 = common.views({"images": images, "ids": ids}, step_seed, AUGMENT)
      with tf.GradientTape() as tape:
        tape.watch(current)
        f, g = common.encode_views(model, current, v1, v2)
        loss = loss_fn(f, g)
      grads = tape.gradient(loss, current)
      current = [w - learning_rate * gr for w, gr in zip(current, grads)]
    return [a - b for a, b in zip(weights, current)]

  return train


def run_scenario(scenario: Scenario, images: np.ndarray, model_builder, *, warmup: int = 2,
                 rounds: int = 5, modes=("reference", "grouped"), precision: str = "float32",
                 xla: bool = False, log=print) -> dict:
  """Times one scenario, its model multiplying in `precision` (`with_precision`); `xla`: also the
  centralized baseline compiled by XLA. Returns a row of `FIELDS`."""
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(with_precision(model_builder, precision))
  row = {"scenario": scenario.name, "precision": precision,
         "images_per_round": scenario.clients * scenario.samples_per_client,
         "baseline": scenario.baseline, "baseline_xla_s": float("nan")}
  for mode in ("reference", "grouped"):
    if mode not in modes:
      row[f"{mode}_s"] = float("nan")
      continue
    process = build_process(scenario, model, image_shape, simulation=mode)
    state = [process.initialize()]

    def one_round(r, process=process, state=state):
      state[0], _ = process.next(state[0], round_clients(images, scenario, r))

    row[f"{mode}_s"] = median_time(one_round, warmup, rounds)
    log(f"  {scenario.name}: {mode} {row[f'{mode}_s']:.3f} s/round")

  weights = [tf.constant(w) for w in model.initial_weights]
  if scenario.baseline == "non_private":  # The same clients' round without privacy.
    plain = build_process(scenario.without_privacy(), model, image_shape)
    plain_state = [plain.initialize()]

    def baseline(r):
      plain_state[0], _ = plain.next(plain_state[0], round_clients(images, scenario, r))
  elif scenario.baseline == "centralized":
    def centralized(step):
      def baseline(r):
        clients = round_clients(images, scenario, r)
        x = np.concatenate([c["images"] for c in clients])
        ids = np.concatenate([c["ids"] for c in clients])
        new, loss = step(weights, x, ids, tf.constant([0, r], tf.int64))
        float(loss)  # Waits for the step.
      return baseline

    baseline = centralized(_centralized_step(model, scenario))
    if xla:
      row["baseline_xla_s"] = median_time(
          centralized(_centralized_step(model, scenario, jit_compile=True)), warmup, rounds)
      log(f"  {scenario.name}: centralized, XLA {row['baseline_xla_s']:.3f} s/step")
  else:
    train = _sequential_training(model, scenario)

    def baseline(r):
      for c in round_clients(images, scenario, r):
        delta = train(weights, c["images"], c["ids"], tf.constant([0, r], tf.int64))
        delta[0].numpy()
  row["baseline_s"] = median_time(baseline, warmup, rounds)
  log(f"  {scenario.name}: {scenario.baseline} {row['baseline_s']:.3f} s/round")
  row["reference_ratio"] = row["reference_s"] / row["baseline_s"]  # NaN where a mode is off.
  row["grouped_ratio"] = row["grouped_s"] / row["baseline_s"]
  row["peak_rss_python_mb"], row["peak_rss_worker_mb"] = peak_rss_mb()
  return row


def format_table(rows: list[dict]) -> str:
  header = ("| scenario | precision | images/round | reference s | grouped s | baseline | baseline s | "
            "XLA baseline s | reference ÷ baseline | grouped ÷ baseline | "
            "peak RSS python / worker MB |")
  lines = [header, "|" + "---|" * 11]
  for r in rows:
    lines.append(f"| {r['scenario']} | {r['precision']} | {r['images_per_round']} | "
                 f"{r['reference_s']:.3f} | {r['grouped_s']:.3f} | {r['baseline']} | "
                 f"{r['baseline_s']:.3f} | {r['baseline_xla_s']:.3f} | "
                 f"{r['reference_ratio']:.2f} | {r['grouped_ratio']:.2f} | "
                 f"{r['peak_rss_python_mb']:.0f} / {r['peak_rss_worker_mb']:.0f} |")
  return "\n".join(lines)


def format_speedups(rows: list[dict], base: str = "float32") -> str:
  """Per scenario measured in `base` and another precision: base's time over the other's, for each
  timed part (> 1: the other precision is faster), and XLA's over the same precision's graph."""
  by_key = {(r["scenario"], r["precision"]): r for r in rows}
  lines = ["| scenario | precision | reference | grouped | baseline | XLA baseline (vs float32 "
           "graph) |", "|" + "---|" * 6]
  for r in rows:
    ref = by_key.get((r["scenario"], base))
    if ref is None or (r["precision"] == base and math.isnan(r["baseline_xla_s"])):
      continue
    lines.append(f"| {r['scenario']} | {r['precision']} | "
                 + " | ".join(f"{ratio(ref[k], r[k]):.2f}x"
                              for k in ("reference_s", "grouped_s", "baseline_s"))
                 + f" | {ratio(ref['baseline_s'], r['baseline_xla_s']):.2f}x |")
  return "\n".join(lines) if len(lines) > 2 else ""


def profiled(scenario: Scenario) -> bool:
  """Whether `profile_grouped_dcco` can break the scenario's round down: its phases are DCCO's."""
  return scenario.phases


def profile_grouped_dcco(scenario: Scenario, images: np.ndarray, model_builder, *,
                         repeats: int = 3) -> dict:
  """Where a grouped DCCO round's time goes: each phase as a TFF computation vs the same TensorFlow
  code as a `tf.function` in this process, a TFF round trip that only broadcasts the weights and
  averages them back, and the server's optimizer step. Best of `repeats` after one untimed call."""
  if not profiled(scenario):
    raise ValueError(f"the profile is for DCCO scenarios; got {scenario.name}")
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  process = build_process(scenario, model, image_shape)
  state = process.initialize()
  groups = grouping.pack(round_clients(images, scenario, 0))
  seed = common.round_seed(0, 0)

  best = lambda fn: best_of(fn, warmup=1, repeats=repeats)  # noqa: E731

  flat = common.flat_weights(state.weights)  # What the process broadcasts (`DCCOProcess`).
  stats = process.aggregate_statistics(flat, seed, groups)
  weights = [tf.constant(w) for w in state.weights]
  group = groups[0]

  @tf.function
  def phase1(w, x, ids, s):
    v1, v2 = common.views({"images": x, "ids": ids}, s, AUGMENT)
    return {"statistics": process.config.loss.statistics(*common.encode_views(model, w, v1, v2)),
            "count": tf.cast(tf.shape(ids)[0], process.dtype)}

  client = dcco_term.client_config(process.config)

  @tf.function
  def phase2(w, x, ids, s, aggregate):
    return dcco_term.train_against(model, client, w, s, {"images": x, "ids": ids}, aggregate)

  aggregate = phase1(weights, group["images"], group["ids"], tf.constant(seed))
  w_type = common.flat_type(model.weight_specs)

  @tff.federated_computation(tff.FederatedType(w_type, tff.SERVER))
  def round_trip(w):
    return tff.federated_mean(tff.federated_broadcast(w))

  zero = [np.zeros_like(w) for w in state.weights]
  return {
      "phase1_tff_s": best(lambda: process.aggregate_statistics(flat, seed, groups)),
      "phase1_tf_function_s": best(lambda: [t.numpy() for t in phase1(
          weights, group["images"], group["ids"], tf.constant(seed))["statistics"].values()]),
      "phase2_tff_s": best(lambda: process.aggregate_updates(flat, seed, stats, groups)),
      "phase2_tf_function_s": best(lambda: phase2(
          weights, group["images"], group["ids"], tf.constant(seed), aggregate)[1].numpy()),
      "broadcast_and_mean_only_s": best(lambda: round_trip(flat)),
      "server_step_s": best(lambda: process.finish_round(state, zero, 0.0, 1)),
  }
