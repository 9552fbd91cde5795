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

import collections
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators, cost, losses, models, rundir, runtime
from tff_ssl import data as data_lib
from tff_ssl import ssl as ssl_lib
from tff_ssl.data import AugmentConfig
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import common, grouping, ssl_model
from tff_ssl.methods import depth_dropout, layerwise
from tff_ssl import runner as runner_lib
from tff_ssl.methods import dcco as dcco_lib
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.methods.fedavg import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation

AUGMENT = AugmentConfig.dcco_cifar(crop_scale=(0.2, 1.0))


@dataclasses.dataclass(frozen=True)
class Scenario:
  name: str
  method: str  # The process: "dcco" or "fedavg".
  clients: int  # Clients per round.
  samples_per_client: int
  local_steps: int = 1
  baseline: str = "centralized"  # or "sequential".
  ssl: str = "cco"  # The clients' SSL method (tff_ssl.ssl): "cco" or "simclr".

  def loss_fn(self) -> Callable:
    """(z1, z2) -> the scenario's within-batch SSL loss at its default hyperparameters."""
    method = ssl_lib.get(self.ssl)
    return lambda z1, z2: method.loss(ssl_lib.Outputs(z1, z2), ClientConfig())


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("dcco_512x1", "dcco", 512, 1),
    Scenario("dcco_128x4", "dcco", 128, 4),
    Scenario("fedavg_cco_128x4", "fedavg", 128, 4),
    Scenario("fedavg_simclr_cross_silo_10x64_e5", "fedavg", 10, 64, local_steps=5,
             baseline="sequential", ssl="simclr"),
    # The mini DCCO table's rounds (global batch 128; run them with --model=mini, its model): the
    # small rounds where TFF's fixed cost per round weighs most.
    Scenario("dcco_128x1", "dcco", 128, 1),
    Scenario("fedavg_cco_32x4", "fedavg", 32, 4),
]}
# What `bin/benchmark` runs unless told (the mini-table scenarios are for --model=mini).
DEFAULT_SCENARIOS = ("dcco_512x1", "dcco_128x4", "fedavg_cco_128x4",
                     "fedavg_simclr_cross_silo_10x64_e5")

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


def mini_model(image_shape) -> Callable[[], tf.keras.Model]:
  """The mini tables' SSL model (the mini regime, docs/mini_regime.md, "Choosing the mini regime"): ResNet-14 with
  a stride-2 stem and 2 x 2 grid pooling + the DCCO table's 512-512-512 projector."""
  config = ExperimentConfig(encoder="resnet14", width=1.0, stem_stride=2, pool_grid=2)

  def build():
    enc = config.build_encoder(image_shape)
    x = tf.keras.Input(image_shape)
    return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], (512, 512, 512))(enc(x)))
  return build


MODELS = {"demo": demo_model, "mini": mini_model, "tiny": tiny_model}


def _median_time(fn: Callable[[int], None], warmup: int, rounds: int) -> float:
  for r in range(warmup):
    fn(r)
  times = []
  for r in range(warmup, warmup + rounds):
    start = time.perf_counter()
    fn(r)
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def best_of(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 3) -> float:
  """The fastest of `repeats` timed calls of `fn`, after `warmup` untimed ones."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def _round_clients(images: np.ndarray, scenario: Scenario, r: int) -> list[dict]:
  """Round r's clients: consecutive disjoint slices of the pool (wrapping around)."""
  n = scenario.clients * scenario.samples_per_client
  start = (r * n) % (len(images) - n + 1)
  ids = np.arange(start, start + n)
  return [common.client_inputs(images[ids[k::scenario.clients]], ids[k::scenario.clients])
          for k in range(scenario.clients)]


def _process(scenario: Scenario, model: FunctionalModel, image_shape, simulation: Simulation,
             mergeable: bool = False):
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=1e-3)
  if scenario.method == "dcco":
    return DCCOProcess(model, image_shape, sgd, DCCOConfig(
        client_learning_rate=1.0, local_steps=scenario.local_steps, augment=AUGMENT), simulation,
        split_phases=mergeable)
  return FedAvgSSLProcess(model, image_shape, sgd, ClientConfig(
      ssl=scenario.ssl, client_learning_rate=0.1,
      local_steps=scenario.local_steps,
      augment=AUGMENT), simulation=simulation)


def _centralized_step(model: FunctionalModel, scenario: Scenario):
  """One SGD step of the within-batch loss on the union of the round's images."""
  loss_fn = scenario.loss_fn()

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
  loss_fn = scenario.loss_fn()

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
  if scenario.method != "dcco":
    raise ValueError(f"the profile is for DCCO scenarios; got {scenario.name}")
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  process = _process(scenario, model, image_shape, Simulation())
  state = process.initialize()
  groups = grouping.pack(_round_clients(images, scenario, 0))
  seed = common.round_seed(0, 0)

  best = lambda fn: best_of(fn, warmup=1, repeats=repeats)  # noqa: E731

  flat = common.flat_weights(state.weights)  # What the process broadcasts (`DCCOProcess`).
  stats = process.aggregate_statistics(flat, seed, groups)
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
  w_type = common.flat_type(model.weight_specs)

  @tff.federated_computation(tff.FederatedType(w_type, tff.SERVER))
  def round_trip(w):
    return tff.federated_mean(tff.federated_broadcast(w))

  zero = [np.zeros_like(w) for w in state.weights]
  return {
      "phase1_tff_s": best(lambda: process.aggregate_statistics(flat, seed, groups)),
      "phase1_tf_function_s": best(lambda: [t.numpy() for t in phase1(
          weights, group["images"], group["ids"], tf.constant(seed))]),
      "phase2_tff_s": best(lambda: process.aggregate_updates(flat, seed, stats, groups)),
      "phase2_tf_function_s": best(lambda: phase2(
          weights, group["images"], group["ids"], tf.constant(seed), aggregate)[1].numpy()),
      "broadcast_and_mean_only_s": best(lambda: round_trip(flat)),
      "server_step_s": best(lambda: process.finish_round(state, zero, 0.0, 1)),
  }


# -- rounds across TFF worker services ----------------------------------------------------------------
WORKER_FIELDS = ("scenario", "workers", "group_size", "round_s", "ratio_to_local", "server_bytes",
                 "client_data_bytes", "result_bytes", "bytes_per_worker", "bytes_per_round")


def _nbytes(value) -> int:
  """Bytes of the tensors in a computation's argument or result (nested containers of arrays)."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.common_libs import structure
  # pylint: enable=g-import-not-at-top
  if isinstance(value, structure.Struct):
    return sum(_nbytes(v) for _, v in structure.to_elements(value))
  if isinstance(value, dict):
    return sum(_nbytes(v) for v in value.values())
  if isinstance(value, (list, tuple)):
    return sum(_nbytes(v) for v in value)
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
  if value is None:
    return 0
  return int(np.asarray(value).nbytes)


def call_bytes(comp, arg, result) -> dict:
  """What one call of a TFF computation moves: its SERVER (and unplaced) arguments, which every worker
  receives whole; its CLIENTS arguments, which the workers share; its result, which each worker
  returns as a partial aggregate of the same type for the driver to merge."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.common_libs import structure
  # pylint: enable=g-import-not-at-top
  param = comp.type_signature.parameter
  if param is None:
    pairs = []
  elif isinstance(param, tff.StructType) and isinstance(arg, structure.Struct):
    pairs = list(zip([t for _, t in structure.to_elements(param)],
                     [v for _, v in structure.to_elements(arg)]))
  else:
    pairs = [(param, arg)]
  out = {"server_bytes": 0, "client_data_bytes": 0, "result_bytes": _nbytes(result)}
  for t, v in pairs:
    at_clients = isinstance(t, tff.FederatedType) and t.placement is tff.CLIENTS
    out["client_data_bytes" if at_clients else "server_bytes"] += _nbytes(v)
  return out


def _recording_context(inner, calls: list):
  """A TFF context that runs every computation on `inner` and appends its `call_bytes` to `calls`."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_base
  # pylint: enable=g-import-not-at-top

  class Recording(context_base.SyncContext):

    def invoke(self, comp, arg):
      result = inner.invoke(comp, arg)
      calls.append(call_bytes(comp, arg, result))
      return result

  return Recording()


def round_bytes(calls: list[dict], workers: int) -> dict:
  """A round's traffic over `workers` workers (at least one: the local context's own service), on
  paper from its calls: each worker gets the SERVER arguments whole and 1/workers of the clients' data,
  and sends back one partial result."""
  w = max(1, workers)
  total = {k: sum(c[k] for c in calls) for k in ("server_bytes", "client_data_bytes",
                                                   "result_bytes")}
  total["bytes_per_worker"] = (total["server_bytes"] + total["result_bytes"] +
                               total["client_data_bytes"] / w)
  total["bytes_per_round"] = w * (total["server_bytes"] + total["result_bytes"]) + total[
      "client_data_bytes"]
  return total


def run_workers_scenario(scenario: Scenario, images: np.ndarray, model_builder,
                         targets: list[str], *, warmup: int = 2, rounds: int = 5,
                         log=print) -> list[dict]:
  """The grouped round of `scenario` on the local context, then across the first 1, 2, ...
  len(targets) workers (one slot of ceil(clients / workers) clients each); rows of `WORKER_FIELDS`.
  The local context is configured again at the end."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  # pylint: enable=g-import-not-at-top
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  rows = []
  try:
    for w in range(len(targets) + 1):
      runtime.configure_context(workers=targets[:w])
      group_size = 0 if w == 0 else -(-scenario.clients // w)
      process = _process(scenario, model, image_shape, Simulation("grouped", group_size=group_size),
                         mergeable=w > 0)
      state = [process.initialize()]
      calls = []

      def one_round(r, process=process, state=state, calls=calls):
        if r == 0:  # The traffic of one (untimed) round.
          stack = context_stack_impl.context_stack
          with stack.install(_recording_context(stack.current, calls)):
            state[0], _ = process.next(state[0], _round_clients(images, scenario, r))
        else:
          state[0], _ = process.next(state[0], _round_clients(images, scenario, r))

      row = {"scenario": scenario.name, "workers": w, "group_size": group_size,
             "round_s": _median_time(one_round, warmup, rounds)}
      row.update(round_bytes(calls, w))
      row["ratio_to_local"] = row["round_s"] / rows[0]["round_s"] if rows else 1.0
      rows.append(row)
      log(f"  {scenario.name}: {'local' if w == 0 else f'{w} worker(s)'} "
          f"{row['round_s']:.3f} s/round")
  finally:
    runtime.configure_context(workers=[])
  return rows


def format_workers_table(rows: list[dict]) -> str:
  mb = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
  lines = ["| scenario | workers | clients per slot | round s | ÷ local | SERVER args MB | "
           "client data MB | results MB | MB per worker | MB per round |", "|" + "---|" * 10]
  for r in rows:
    lines.append(f"| {r['scenario']} | {r['workers'] or 'local'} | {r['group_size'] or 'all'} | "
                 f"{r['round_s']:.3f} | {r['ratio_to_local']:.2f} | {mb(r['server_bytes'])} | "
                 f"{mb(r['client_data_bytes'])} | {mb(r['result_bytes'])} | "
                 f"{mb(r['bytes_per_worker'])} | {mb(r['bytes_per_round'])} |")
  return "\n".join(lines)


# -- aggregation cost ------------------------------------------------------------------------------
AGGREGATION_FIELDS = ("strategy", "clients", "parameters", "server_stage_s", "server_stage_ratio",
                      "tff_process_s", "tff_process_ratio", "client_stage_s", "client_stage_ratio",
                      "tff_total_s", "tff_make_values_s")


def ldawa_model(image_shape) -> Callable[[], tf.keras.Model]:
  """The L-DAWA paper's model: ResNet-18 (GroupNorm + WS here) + SimCLR projector [2048, 128]."""
  def build():
    enc = models.build_encoder("resnet18", image_shape, width=1.0, small_input=True)
    x = tf.keras.Input(image_shape)
    return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], (2048, 128))(enc(x)))
  return build


AGGREGATION_MODELS = {"resnet18": ldawa_model, "tiny": tiny_model}


def _value_makers(specs, scales):
  """Plain TF functions that make the clients' values cheaply (also run inside the TFF worker).

  Aggregation arithmetic does not depend on the values, so they are made at memset speed, keeping the
  time to make them (subtracted from the measurements, with its noise) small: `make_global()`: a
  global model w_g and a direction D, each tensor constant (its scale). `make_client(g, k)`: client
  k's update Delta_k = a_k D + b_k w_g and its ClientInfo (N_k = 100 + 50 k, L_k = 5 + 0.1 k, the
  model w_g).
  """
  def make_global():
    return collections.OrderedDict(
        w=[tf.fill(spec.shape, s) for spec, s in zip(specs, scales)],
        d=[tf.fill(spec.shape, -1e-2 * s) for spec, s in zip(specs, scales)])

  def make_client(g, k):
    k_f = tf.cast(k, tf.float32)
    a, b = tf.cos(0.3 * k_f), 1e-2 * (tf.sin(0.3 * k_f) + 0.5)
    update = [a * d + b * w for d, w in zip(g["d"], g["w"])]
    return collections.OrderedDict(update=update, info=collections.OrderedDict(
        num_examples=100.0 + 50.0 * k_f, loss=5.0 + 0.1 * k_f, model=list(g["w"])))

  return make_global, make_client


def time_aggregation(model_builder, strategies, *, clients: int = 10, warmup: int = 2,
                     repeats: int = 5, log=print) -> list[dict]:
  """Median time of one aggregation of `clients` client updates by each strategy, three ways:

    server_stage  what the server computes (`create_grouped`): the weighted mean of the values the
                  clients send, each having computed its own value and weight (for the DAWA family,
                  its layer angles: a client holds w_g and w_k). Net of making the values, as below.

    tff_process   the strategy's TFF aggregation process (`factory.create(...).next`) in the TFF
                  worker, reference simulation (one TFF client per client; what a deployment runs):
                  the per-client stage at CLIENTS, then the weighted mean at the server. The clients'
                  values are made inside the worker (a model broadcast, each client's update
                  from its index), so that no 10 x 2 models cross from Python (≈ 35 s for
                  ResNet-18, the same for every strategy); the time to make them (`tff_make_values_s`, the same computation without the
                  aggregation) is subtracted from the total (`tff_total_s`).
    client_stage  the per-client stage and the fold of every client into the weighted mean as one
                  `tf.function` (what a grouped slot computes): the arithmetic alone.

  Ratios are to the first strategy (FedAvg).
  """
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  w_type = common.weights_type(model)
  info_type = aggregators.client_info_type(w_type)
  specs = list(model.weight_specs)
  scales = [float(np.abs(w).mean()) + 1e-3 for w in model.initial_weights]
  params = sum(int(np.prod(s.shape)) for s in specs)
  make_global_tf, make_client_tf = _value_makers(specs, scales)
  make_global = tff.tensorflow.computation(make_global_tf)
  global_type = make_global.type_signature.result
  make_client = tff.tensorflow.computation(make_client_tf, global_type, np.int32)

  @tff.tensorflow.computation(make_client.type_signature.result)
  def checksum_values(v):  # Forces the values to be made; returns one number.
    return tf.add_n([tf.reduce_sum(u) for u in v["update"]] +
                    [tf.reduce_sum(w) for w in v["info"]["model"]] + [v["info"]["loss"]])

  @tff.tensorflow.computation(w_type)
  def checksum_result(w):
    return tf.add_n([tf.reduce_sum(t) for t in w])

  def made_at_clients(ks):
    g = tff.federated_broadcast(tff.federated_eval(make_global, tff.SERVER))
    return tff.federated_map(make_client, (g, ks))

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def make_only(ks):
    return tff.federated_sum(tff.federated_map(checksum_values, made_at_clients(ks)))

  ks = list(range(clients))
  g = make_global_tf()  # The same values in Python, for the client-stage timing.
  updates_t = [make_client_tf(g, k)["update"] for k in ks]
  global_t = list(g["w"])
  make_s = _median_time(lambda r: make_only(ks), warmup, repeats)
  log(f"  making {clients} clients' values in the TFF worker: {make_s:.3f} s")
  rows = []
  for name in strategies:
    factory = aggregators.AggregatorConfig(name=name).build(model)
    process = factory.create(w_type, info_type)

    aggregate = _aggregate_made_values(process, made_at_clients, checksum_result)
    state = process.initialize()
    total_s = _median_time(lambda r, aggregate=aggregate: aggregate(state, ks), warmup, repeats)
    server_only = _server_stage_of_made_values(factory, w_type, specs, make_client,
                                               made_at_clients, checksum_result)
    server_state = factory.create_grouped(w_type).initialize()
    server_s = _median_time(lambda r, server_only=server_only: server_only(server_state, ks),
                            warmup, repeats)
    fold = _fold_function(factory, specs, clients)
    n = tf.constant([100.0 + 50.0 * k for k in ks])
    losses_t = tf.constant([5.0 + 0.1 * k for k in ks])
    stage_s = _median_time(lambda r, fold=fold: fold(updates_t, global_t, n, losses_t)[0].numpy(),
                           warmup, repeats)
    rows.append({"strategy": name, "clients": clients, "parameters": params,
                 "server_stage_s": max(server_s - make_s, 0.0),
                 "tff_process_s": max(total_s - make_s, 0.0), "client_stage_s": stage_s,
                 "tff_total_s": total_s, "tff_make_values_s": make_s})
    log(f"  {name}: server stage {server_s - make_s:.3f} s, TFF process {total_s - make_s:.3f} s "
        f"(total {total_s:.3f} s), client stage {stage_s:.3f} s")
  for row in rows:
    row["server_stage_ratio"] = row["server_stage_s"] / max(rows[0]["server_stage_s"], 1e-9)
    row["tff_process_ratio"] = row["tff_process_s"] / max(rows[0]["tff_process_s"], 1e-9)
    row["client_stage_ratio"] = row["client_stage_s"] / rows[0]["client_stage_s"]
  return rows


def _aggregate_made_values(process, made_at_clients, checksum_result):
  """One aggregation by `process` of values made at CLIENTS from their index; returns a checksum."""
  @tff.federated_computation(process.initialize.type_signature.result,
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def aggregate(state, ks):
    values = made_at_clients(ks)
    out = process.next(state, values.update, values.info)
    return tff.federated_map(checksum_result, out.result)
  return aggregate


def _server_stage_of_made_values(factory, w_type, specs, make_client, made_at_clients,
                                 checksum_result):
  """The strategy's server stage alone (`create_grouped`: the weighted mean of what clients send,
  after each computed its own value and weight), on values made at CLIENTS; returns a checksum."""
  server = factory.create_grouped(w_type)
  stats_specs = factory.stats_spec(specs)

  @tff.tensorflow.computation(make_client.type_signature.result)
  def as_contribution(v):
    info = v["info"]
    log_weight = aggregators.base.base_log_weight(factory.weighting, info["num_examples"],
                                                  info["loss"])
    return collections.OrderedDict(
        value=list(v["update"]), log_weight=log_weight, max_log_weight=log_weight,
        stats=collections.OrderedDict((k, tf.zeros(sp.shape, sp.dtype))
                                      for k, sp in stats_specs.items()))

  @tff.federated_computation(server.initialize.type_signature.result,
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def server_only(state, ks):
    contributions = tff.federated_map(as_contribution, made_at_clients(ks))
    return tff.federated_map(checksum_result, server.next(state, contributions).result)
  return server_only


def _fold_function(factory, specs, clients: int):
  """A grouped slot's arithmetic: every client's stage folded into the weighted mean."""

  @tf.function
  def fold(updates_t, global_t, n, losses_t):
    acc = factory.initial_accumulator(specs)
    for k in range(clients):
      scale, log_weight, stats = factory.client_terms(
          updates_t[k], aggregators.ClientInfo(n[k], losses_t[k], global_t), tf.constant(0))
      acc = factory.accumulate(acc, updates_t[k], scale, log_weight, stats)
    return factory.finalize(acc, global_t).value
  return fold


def format_aggregation_table(rows: list[dict]) -> str:
  lines = [f"Aggregation of {rows[0]['clients']} client updates of {rows[0]['parameters']:,} "
           f"parameters (median; server stage and TFF process: net of {rows[0]['tff_make_values_s']:.3f} s to make "
           f"the clients' values in the worker):", "",
           "| strategy | server stage s | ÷ FedAvg | TFF aggregation process s | ÷ FedAvg "
           "| client stage + mean (tf.function) s | ÷ FedAvg |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['strategy']} | {r['server_stage_s']:.3f} | {r['server_stage_ratio']:.2f} | "
                 f"{r['tff_process_s']:.3f} | {r['tff_process_ratio']:.2f} | "
                 f"{r['client_stage_s']:.3f} | {r['client_stage_ratio']:.2f} |")
  return "\n".join(lines)


# -- What a client pays per stage of layer-wise training (LW-FedSSL's claim) --------------------------

def layerwise_costs(rows, image_shape=None, *, batch: int = 0, seed: int = 0,
                    memory: bool = False, flops: bool = True) -> list[dict]:
  """Per row (name, `ExperimentConfig`; the first is the end-to-end reference) and stage s of its
  ViT's blocks, what one client pays in a round: its download (the stage model the simulation
  broadcasts, and what a client that took part in every round needs: the trained tensors, or the
  whole stage model where the server changes the frozen blocks) and upload (bytes, from the TFF
  types), one local step's float operations (from the graph; FLL + DD: the expectation over its keep
  draws, from the graphs of every frozen block kept and of none) and, with `memory`, the step's
  measured peak memory (`cost.peak_memory`, every block kept). A step takes `batch` images (0: the
  row's local batch). End-to-end rows train the whole model in every stage."""
  out = []
  depth = None
  for name, config in rows:
    shape = tuple(image_shape or data_lib.image_shape(config.dataset))
    b = batch or config.local_batch_size
    if b < 2:
      raise ValueError(f"{name}: a local step needs a batch of >= 2 images; got {b} (set --batch)")
    images = np.random.default_rng(seed).integers(0, 256, (b,) + shape, np.uint8)
    tf.keras.utils.set_random_seed(config.seed)
    model = FunctionalModel(ssl_model.ssl_model_builder(config, shape))
    process = runner_lib.build_process(config, model, shape)
    stages = max(layerwise.block_of(n) for n in model.names)
    if depth is not None and stages != depth:
      raise ValueError(f"{name}: its encoder has {stages} blocks, the reference's {depth}")
    depth = stages
    for s in range(1, depth + 1):
      if isinstance(process, layerwise.LayerwiseProcess):
        stage_model, mask = process.stage_models[s - 1], process.stage_mask(s)
        cfg, refresh = process.stage_config(s), process.refreshes_frozen
      else:  # End to end: the whole model in every stage.
        stage_model, mask, cfg, refresh = model, process.mask, process.config, True
      c = cost.local_step_cost(stage_model, mask, cfg, images, memory=memory, flops=flops)
      dropout = next((t for t in cfg.terms if isinstance(t, depth_dropout.DepthDropout)), None)
      if flops and dropout is not None:
        none = cost.local_step_cost(stage_model, mask, cfg, images, flops=True,
                                    keep=(False,) * dropout.droppable_blocks)["step_flops"]
        c["step_flops"] = int(round(none + (1 - dropout.rate) * (c["step_flops"] - none)))
      c["kept_download_bytes"] = c["download_bytes"] if refresh else c["trained_bytes"]
      # The paper's communication figures count the encoder only (the heads are common to all).
      encoder = [n.startswith(ssl_model.ENCODER_NAME + "/") for n in stage_model.names]
      sizes = [int(np.prod(w.shape)) * w.dtype.size for w in stage_model.weight_specs]
      c["encoder_download_bytes"] = sum(b for b, e, t in zip(sizes, encoder, mask.trained)
                                        if e and (refresh or t))
      c["encoder_upload_bytes"] = sum(b for b, e, t in zip(sizes, encoder, mask.trained) if e and t)
      out.append({"method": name, "stage": s, "batch": b, **c})
  reference = {r["stage"]: r for r in out if r["method"] == rows[0][0]}
  for r in out:
    ref = reference[r["stage"]]
    for key in ("download_bytes", "kept_download_bytes", "upload_bytes", "step_flops",
                "step_peak_bytes"):
      if key in r:
        r[key.replace("_bytes", "").replace("step_", "") + "_ratio"] = _ratio(r[key], ref[key])
  return out


def _ratio(a: float, b: float) -> float:
  return a / b if b else float("nan")


def table_rows(table) -> list[tuple[str, ExperimentConfig]]:
  """(name, config) of each row of a `tff_ssl.tables.Table` in its first column."""
  return [(row.name, table.cell_config(row, table.columns[0])) for row in table.rows]


def write_rows(rows, path: str) -> None:
  """(name, config) rows as JSON (`read_rows` reads them)."""
  rundir.write_atomic(path, json.dumps([{"name": n, "config": dataclasses.asdict(c)}
                                        for n, c in rows], indent=1) + "\n")


def read_rows(path: str) -> list[tuple[str, ExperimentConfig]]:
  with open(path) as f:
    return [(r["name"], ExperimentConfig(**r["config"])) for r in json.load(f)]


def layerwise_cost_report(table, output_dir: str, *, memory: bool, flops: bool) -> str:
  """The markdown of `bin/benchmark --layerwise` for a table's rows, run in a process of its own
  (the memory measurement needs `cost.MEASURING_ENV` from the start): the rows go to
  output_dir/cost_rows.json, the costs to output_dir/cost.csv and the markdown to
  output_dir/cost.md, which a later call with the same rows reads instead of measuring again."""
  rows_path, path = os.path.join(output_dir, "cost_rows.json"), os.path.join(output_dir, "cost.md")
  rows = table_rows(table)
  if os.path.exists(path) and os.path.exists(rows_path) and read_rows(rows_path) == rows:
    return open(path).read()
  write_rows(rows, rows_path)
  binary = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin",
                        "benchmark")
  command = [sys.executable, binary, "--layerwise", f"--layerwise_rows={rows_path}",
             f"--output_csv={os.path.join(output_dir, 'cost.csv')}",
             "--memory" if memory else "--nomemory", "--flops" if flops else "--noflops"]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
  text = done.stdout.split(COST_TABLE_START, 1)[-1].split("\nwrote ", 1)[0]
  md = f"## What a client pays\n\n{COST_TABLE_START}{text.rstrip()}\n"
  rundir.write_atomic(path, md)
  return md


def layerwise_totals(rows: list[dict]) -> list[dict]:
  """Per method, over a run of equal stages: total download (of a client in every round), upload
  and local FLOPs, and the peak memory of the worst stage, each beside the first method's
  (end-to-end) as the paper's "x lower" ratios."""
  names, out = list(dict.fromkeys(r["method"] for r in rows)), []
  for m in names:
    mine = [r for r in rows if r["method"] == m]
    t = {"method": m, "download_bytes": sum(r["kept_download_bytes"] for r in mine),
         "upload_bytes": sum(r["upload_bytes"] for r in mine),
         "encoder_download_bytes": sum(r["encoder_download_bytes"] for r in mine),
         "encoder_upload_bytes": sum(r["encoder_upload_bytes"] for r in mine)}
    t["encoder_total_bytes"] = t["encoder_download_bytes"] + t["encoder_upload_bytes"]
    if "step_flops" in mine[0]:
      t["flops"] = sum(r["step_flops"] for r in mine)
    if "step_peak_bytes" in mine[0]:
      t["peak_bytes"] = max(r["step_peak_bytes"] for r in mine)
    out.append(t)
  for t in out:
    for key in [k for k in t if k != "method"]:
      t[key + "_lower"] = _ratio(out[0][key], t[key])
  return out


COST_TABLE_START = "A client's cost per round of stage s"


def format_layerwise_table(rows: list[dict]) -> str:
  memory, flops = "step_peak_bytes" in rows[0], "step_flops" in rows[0]
  batches = ", ".join(f"{m}: {b}" for m, b in dict((r["method"], r["batch"]) for r in rows).items())
  lines = [f"{COST_TABLE_START}: download (MB, from the TFF types: the stage model the simulation "
           f"broadcasts, and what a client in every round needs), upload (MB)"
           + (f", one local step (GFLOPs, from the graph; elementwise ops TF does not count: "
              f"{', '.join(rows[0]['uncounted_ops']) or 'none'})" if flops else "")
           + (", its measured peak memory above the model's weights (MB)" if memory else "")
           + f". Images per local step: {batches}.", "",
           "| method | stage | broadcast MB | needed MB | upload MB | ÷ end-to-end |"
           + (" step GFLOPs | ÷ end-to-end |" if flops else "")
           + (" step peak MB | ÷ end-to-end |" if memory else ""),
           "|---|---|---|---|---|---|" + ("---|---|" if flops else "") + ("---|---|" if memory else "")]
  for r in rows:
    lines.append(f"| {r['method']} | {r['stage']} | {r['download_bytes'] / 2**20:.2f} | "
                 f"{r['kept_download_bytes'] / 2**20:.2f} | "
                 f"{r['upload_bytes'] / 2**20:.2f} | {r['upload_ratio']:.2f} |" +
                 (f" {r['step_flops'] / 1e9:.3f} | {r['flops_ratio']:.2f} |" if flops else "") +
                 (f" {r['step_peak_bytes'] / 2**20:.1f} | {r['peak_ratio']:.2f} |" if memory else ""))
  totals = layerwise_totals(rows)
  lines += ["", "Over a run of equal stages, the first row's (end-to-end) total, or peak, ÷ the "
            "method's: how many times lower (the paper's headline form).", "",
            "| method | download × lower | upload × lower | encoder only (the paper's "
            "accounting): download / upload / both × lower |" + (" FLOPs × lower |" if flops else "")
            + (" peak memory × lower |" if memory else ""),
            "|---|---|---|---|" + ("---|" if flops else "") + ("---|" if memory else "")]
  for t in totals:
    lines.append(f"| {t['method']} | {t['download_bytes_lower']:.2f} | "
                 f"{t['upload_bytes_lower']:.2f} | {t['encoder_download_bytes_lower']:.2f} / "
                 f"{t['encoder_upload_bytes_lower']:.2f} / {t['encoder_total_bytes_lower']:.2f} |" +
                 (f" {t['flops_lower']:.2f} |" if flops else "") +
                 (f" {t['peak_bytes_lower']:.2f} |" if memory else ""))
  return "\n".join(lines)
