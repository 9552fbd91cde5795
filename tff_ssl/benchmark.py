"""Round-time benchmark: reference vs grouped simulation vs the centralized equivalent, in one process.

For each scenario the same images are trained three ways, each timed over `rounds` rounds after
`warmup` untimed ones (tracing, the TFF worker's start), and the median round time is reported:

  reference   one real client per TFF client slot (`grouping.Simulation(mode="reference")`)
  grouped     the round's clients packed into TFF client slots (the default mode)
  baseline    what the round should cost without federation: one centralized SGD step on the union
              of the round's images (one-local-step scenarios), or plain sequential local training of
              the same clients, one compiled `tf.function` per client call (cross-silo)

and the ratios reference/baseline and grouped/baseline. Peak resident memory is that of this process
and of the TFF worker process (`worker_binary`), which holds the round's tensors while it runs.
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import losses, models, runtime
from tff_ssl.data import AugmentConfig
from tff_ssl.federated import common
from tff_ssl.federated.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.fedavg import FedAvgSSLConfig, FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation

AUGMENT = AugmentConfig.dcco_cifar(crop_scale=(0.2, 1.0))


@dataclasses.dataclass(frozen=True)
class Scenario:
  name: str
  method: str  # "dcco", "fedavg_cco" or "fedavg_simclr".
  clients: int  # Clients per round.
  samples_per_client: int
  local_steps: int = 1
  baseline: str = "centralized"  # or "sequential".

  @property
  def loss(self) -> str:
    return "nt_xent" if self.method == "fedavg_simclr" else "cco"


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("dcco_512x1", "dcco", 512, 1),
    Scenario("dcco_128x4", "dcco", 128, 4),
    Scenario("fedavg_cco_128x4", "fedavg_cco", 128, 4),
    Scenario("fedavg_simclr_cross_silo_10x64_e5", "fedavg_simclr", 10, 64, local_steps=5,
             baseline="sequential"),
]}

FIELDS = ("scenario", "images_per_round", "reference_s", "grouped_s", "baseline", "baseline_s",
          "reference_ratio", "grouped_ratio", "peak_rss_python_mb", "peak_rss_worker_mb")


def demo_model(image_shape) -> Callable[[], tf.keras.Model]:
  """The README demo's SSL model: ResNet-14 (CIFAR widths 16/32/64) + 512-512-512 projector."""
  def build():
    enc = models.build_encoder("resnet14", image_shape, width=1.0, small_input=True)
    x = tf.keras.Input(image_shape)
    return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], (512, 512, 512))(enc(x)))
  return build


def tiny_model(image_shape) -> Callable[[], tf.keras.Model]:
  """A two-convolution model for smoke tests of the benchmark itself."""
  def build():
    x = tf.keras.Input(image_shape)
    h = models.layers.WSConv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    h = tf.keras.layers.ReLU()(models.layers.group_norm(8)(h))
    h = tf.keras.layers.GlobalAveragePooling2D()(h)
    return tf.keras.Model(x, models.build_mlp_head(8, (16, 16))(h))
  return build


MODELS = {"demo": demo_model, "tiny": tiny_model}


def _median_time(fn: Callable[[int], None], warmup: int, rounds: int) -> float:
  for r in range(warmup):
    fn(r)
  times = []
  for r in range(warmup, warmup + rounds):
    start = time.perf_counter()
    fn(r)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _round_clients(images: np.ndarray, scenario: Scenario, r: int) -> list[dict]:
  """Round r's clients: consecutive disjoint slices of the pool (wrapping around)."""
  n = scenario.clients * scenario.samples_per_client
  start = (r * n) % (len(images) - n + 1)
  ids = np.arange(start, start + n)
  return [common.client_inputs(images[ids[k::scenario.clients]], ids[k::scenario.clients])
          for k in range(scenario.clients)]


def _process(scenario: Scenario, model: FunctionalModel, image_shape, simulation: Simulation):
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=1e-3)
  if scenario.method == "dcco":
    return DCCOProcess(model, image_shape, sgd, DCCOConfig(
        client_learning_rate=1.0, local_steps=scenario.local_steps, augment=AUGMENT), simulation)
  return FedAvgSSLProcess(model, image_shape, sgd, FedAvgSSLConfig(
      loss=scenario.loss, client_learning_rate=0.1, local_steps=scenario.local_steps,
      augment=AUGMENT), simulation=simulation)


def _centralized_step(model: FunctionalModel, scenario: Scenario):
  """One SGD step of the within-batch loss on the union of the round's images."""
  loss_fn = losses.get_loss(scenario.loss)

  @tf.function
  def step(weights, images, ids, seed):
    v1, v2 = common.views({"images": images, "ids": ids}, seed, AUGMENT)
    with tf.GradientTape() as tape:
      tape.watch(weights)
      f, g = common.encode_views(model, weights, v1, v2)
      loss = loss_fn(f, g)
    grads = tape.gradient(loss, weights)
    return [w - 1e-3 * gr for w, gr in zip(weights, grads)], loss

  return step


def _sequential_training(model: FunctionalModel, scenario: Scenario):
  """One client's local training (its local steps), compiled once and called per client."""
  loss_fn = losses.get_loss(scenario.loss)

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
      current = [w - 0.1 * gr for w, gr in zip(current, grads)]
    return [a - b for a, b in zip(weights, current)]

  return train


def _peak_rss_mb() -> tuple[float, float]:
  python = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  worker = 0.0
  for proc in runtime.worker_processes():
    try:
      with open(f"/proc/{proc.pid}/status") as f:
        for line in f:
          if line.startswith("VmHWM:"):
            worker = max(worker, int(line.split()[1]) / 1024)
    except OSError:
      pass
  return python, worker


def run_scenario(scenario: Scenario, images: np.ndarray, model_builder, *, warmup: int = 2,
                 rounds: int = 5, modes=("reference", "grouped"), log=print) -> dict:
  """Times one scenario; returns a row of `FIELDS`."""
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  row = {"scenario": scenario.name, "images_per_round": scenario.clients * scenario.samples_per_client,
         "baseline": scenario.baseline}
  for mode in ("reference", "grouped"):
    if mode not in modes:
      row[f"{mode}_s"] = float("nan")
      continue
    process = _process(scenario, model, image_shape, Simulation(mode=mode))
    state = [process.initialize()]

    def one_round(r, process=process, state=state):
      state[0], _ = process.next(state[0], _round_clients(images, scenario, r))

    row[f"{mode}_s"] = _median_time(one_round, warmup, rounds)
    log(f"  {scenario.name}: {mode} {row[f'{mode}_s']:.3f} s/round")

  weights = [tf.constant(w) for w in model.initial_weights]
  if scenario.baseline == "centralized":
    step = _centralized_step(model, scenario)

    def baseline(r):
      clients = _round_clients(images, scenario, r)
      x = np.concatenate([c["images"] for c in clients])
      ids = np.concatenate([c["ids"] for c in clients])
      new, loss = step(weights, x, ids, tf.constant([0, r], tf.int64))
      float(loss)  # Waits for the step.
  else:
    train = _sequential_training(model, scenario)

    def baseline(r):
      for c in _round_clients(images, scenario, r):
        delta = train(weights, c["images"], c["ids"], tf.constant([0, r], tf.int64))
        delta[0].numpy()
  row["baseline_s"] = _median_time(baseline, warmup, rounds)
  log(f"  {scenario.name}: {scenario.baseline} {row['baseline_s']:.3f} s/round")
  row["reference_ratio"] = row["reference_s"] / row["baseline_s"]
  row["grouped_ratio"] = row["grouped_s"] / row["baseline_s"]
  row["peak_rss_python_mb"], row["peak_rss_worker_mb"] = _peak_rss_mb()
  return row


def format_table(rows: list[dict]) -> str:
  header = ("| scenario | images/round | reference s | grouped s | baseline | baseline s | "
            "reference ÷ baseline | grouped ÷ baseline | peak RSS python / worker MB |")
  lines = [header, "|" + "---|" * 9]
  for r in rows:
    lines.append(f"| {r['scenario']} | {r['images_per_round']} | {r['reference_s']:.3f} | "
                 f"{r['grouped_s']:.3f} | {r['baseline']} | {r['baseline_s']:.3f} | "
                 f"{r['reference_ratio']:.2f} | {r['grouped_ratio']:.2f} | "
                 f"{r['peak_rss_python_mb']:.0f} / {r['peak_rss_worker_mb']:.0f} |")
  return "\n".join(lines)


def profile_grouped_dcco(scenario: Scenario, images: np.ndarray, model_builder, *,
                         repeats: int = 3) -> dict:
  """Where a grouped DCCO round's time goes: each phase as a TFF computation vs the same TensorFlow
  code as a `tf.function` in this process, a TFF round trip that only broadcasts the weights and
  averages them back, and the server's optimizer step. Best of `repeats` after one untimed call."""
  from tff_ssl.federated import dcco as dcco_lib, grouping  # pylint: disable=g-import-not-at-top
  if scenario.method != "dcco":
    raise ValueError(f"the profile is for DCCO scenarios; got {scenario.name}")
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  process = _process(scenario, model, image_shape, Simulation())
  state = process.initialize()
  groups = grouping.pack(_round_clients(images, scenario, 0))
  seed = common.round_seed(0, 0)

  def best(fn):
    fn()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    return min(times)

  stats = process.aggregate_statistics(state.weights, seed, groups)
  weights = [tf.constant(w) for w in state.weights]
  group = groups[0]

  @tf.function
  def phase1(w, x, ids, s):
    v1, v2 = common.views({"images": x, "ids": ids}, s, AUGMENT)
    return losses.encoding_statistics(*common.encode_views(model, w, v1, v2))

  @tf.function
  def phase2(w, x, ids, s, aggregate):
    v1, v2 = common.views({"images": x, "ids": ids}, s, AUGMENT)
    return dcco_lib._local_training(model, process.config, w, v1, v2, aggregate)  # pylint: disable=protected-access

  aggregate = phase1(weights, group["images"], group["ids"], tf.constant(seed))
  w_type = common.weights_type(model)

  @tff.federated_computation(tff.FederatedType(w_type, tff.SERVER))
  def round_trip(w):
    return tff.federated_mean(tff.federated_broadcast(w))

  zero = [np.zeros_like(w) for w in state.weights]
  return {
      "phase1_tff_s": best(lambda: process.aggregate_statistics(state.weights, seed, groups)),
      "phase1_tf_function_s": best(lambda: [t.numpy() for t in phase1(
          weights, group["images"], group["ids"], tf.constant(seed))]),
      "phase2_tff_s": best(lambda: process.aggregate_updates(state.weights, seed, stats, groups)),
      "phase2_tf_function_s": best(lambda: phase2(
          weights, group["images"], group["ids"], tf.constant(seed), aggregate)[1].numpy()),
      "broadcast_and_mean_only_s": best(lambda: round_trip(state.weights)),
      "server_step_s": best(lambda: process.finish_round(state, zero, 0.0, 1)),
  }
