"""What the benchmarks share: the round scenarios (`Scenario`, `SCENARIOS`) and how a scenario's
process is built (through the method registry, `Scenario.config`), the models they time, and timing
and memory helpers."""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tff_ssl import models, runner, runtime
from tff_ssl import privacy as privacy_lib
from tff_ssl import ssl as ssl_lib
from tff_ssl.data import AugmentConfig
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import common
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.methods import dcco_private

AUGMENT = AugmentConfig.dcco_cifar(crop_scale=(0.2, 1.0))
# The server's step in every scenario: plain SGD at a constant rate.
SERVER_OPTIMIZER, SERVER_LEARNING_RATE = "sgd", 1e-3


@dataclasses.dataclass(frozen=True)
class Scenario:
  """A round to time: `clients` clients of `samples_per_client` images each, trained by the
  federated method `method` (a `tff_ssl.methods` name) with the client SSL loss `ssl`."""

  name: str
  method: str  # The federated method (`tff_ssl.methods`): "dcco" or "fedavg".
  clients: int  # Clients per round.
  samples_per_client: int
  local_steps: int = 1
  baseline: str = "centralized"  # or "sequential", or "non_private" (`without_privacy`).
  ssl: str = "cco"  # The clients' SSL method (tff_ssl.ssl): "cco" or "simclr".
  client_learning_rate: float = 1.0  # DCCO's (the paper's plain gradient descent at 1.0).
  # Further config fields of the method's (e.g. DCCO's statistics mode), as (name, value) pairs.
  fields: tuple[tuple[str, Any], ...] = ()
  # Whether `bin/benchmark --profile` breaks the round down into DCCO's phases (a DCCO scenario).
  phases: bool = False

  def loss_fn(self) -> Callable:
    """(z1, z2) -> the scenario's within-batch SSL loss at its default hyperparameters."""
    method = ssl_lib.get(self.ssl)
    return lambda z1, z2: method.loss(ssl_lib.Outputs(z1, z2), ssl_lib.Hparams())

  def without_privacy(self) -> "Scenario":
    """The same round without DP, secure sums or compression (the `non_private` baseline)."""
    private = set(privacy_lib.FIELD_NAMES) | {f.name for f in dcco_private.FIELDS}
    return dataclasses.replace(self, fields=tuple(f for f in self.fields if f[0] not in private),
                               baseline="centralized")

  def config(self, simulation: str = "grouped", group_size: int = 0) -> ExperimentConfig:
    """The scenario's rounds as an `ExperimentConfig`: what its method's registry entry builds the
    process from (`build_process`), in simulation mode `simulation` with `group_size` clients per
    TFF client slot (0: the whole round in one)."""
    return ExperimentConfig(
        method=self.method, ssl=self.ssl, clients_per_round=self.clients,
        samples_per_client=self.samples_per_client, local_steps=self.local_steps,
        client_learning_rate=self.client_learning_rate, crop_min_scale=AUGMENT.crop_scale[0],
        blur=AUGMENT.blur, server_optimizer=SERVER_OPTIMIZER,
        server_learning_rate=SERVER_LEARNING_RATE, server_lr_schedule="constant",
        simulation=simulation, group_size=group_size, **dict(self.fields))


DP_FIELDS = (("dp", "gaussian_fixed"), ("dp_noise_multiplier", 1.0), ("dp_clip", 1.0),
             ("num_clients", 60_000))

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("dcco_512x1", "dcco", 512, 1, phases=True),
    Scenario("dcco_128x4", "dcco", 128, 4, phases=True),
    # One-computation DCCO (--dcco_statistics=previous): the timed rounds are one phase (the first,
    # two-phase round is among the untimed warm-up ones).
    Scenario("dcco_previous_512x1", "dcco", 512, 1, fields=(("dcco_statistics", "previous"),),
             phases=True),
    Scenario("dcco_previous_128x4", "dcco", 128, 4, fields=(("dcco_statistics", "previous"),),
             phases=True),
    Scenario("fedavg_cco_128x4", "fedavg", 128, 4, client_learning_rate=0.1),
    Scenario("fedavg_simclr_cross_silo_10x64_e5", "fedavg", 10, 64, local_steps=5,
             baseline="sequential", ssl="simclr", client_learning_rate=0.1),
    # The mini DCCO table's rounds (global batch 128; run them with --model=mini, its model): the
    # small rounds where TFF's fixed cost per round weighs most.
    Scenario("dcco_128x1", "dcco", 128, 1, phases=True),
    Scenario("fedavg_cco_32x4", "fedavg", 32, 4, client_learning_rate=0.1),
    # DP-DCCO at the cohorts where DP learns (issue 53): each real client's update clipped (one
    # vectorized pass per chunk of images, `dcco_private.clipped_records`), beside the non-private
    # round of the same clients. Noise multiplier 1 over a population of 60,000 one-image users.
    Scenario("dp_dcco_1024x1", "dcco", 1024, 1, baseline="non_private", fields=DP_FIELDS),
    Scenario("dp_dcco_4096x1", "dcco", 4096, 1, baseline="non_private", fields=DP_FIELDS),
    # The same with ghost norms (--dp_norms=ghost, `dcco_private.ghost_records`): no per-image
    # gradient formed.
    Scenario("dp_dcco_1024x1_ghost", "dcco", 1024, 1, baseline="non_private",
             fields=DP_FIELDS + (("dp_norms", "ghost"),)),
    Scenario("dp_dcco_4096x1_ghost", "dcco", 4096, 1, baseline="non_private",
             fields=DP_FIELDS + (("dp_norms", "ghost"),)),
]}
# What `bin/benchmark` runs unless told (the mini-table scenarios are for --model=mini).
DEFAULT_SCENARIOS = ("dcco_512x1", "dcco_previous_512x1", "dcco_128x4", "dcco_previous_128x4",
                     "fedavg_cco_128x4",
                     "fedavg_simclr_cross_silo_10x64_e5")


def build_process(scenario: Scenario, model: FunctionalModel, image_shape,
                  simulation: str = "grouped", group_size: int = 0):
  """The scenario's TFF process over `model`, built by its method's registry entry as a run builds
  it (`runner.build_process`: across workers, when the context has them, under TFF's mergeable
  execution)."""
  return runner.build_process(scenario.config(simulation, group_size), model, image_shape)


def round_clients(images: np.ndarray, scenario: Scenario, r: int) -> list[dict]:
  """Round r's clients: consecutive disjoint slices of the pool (wrapping around)."""
  n = scenario.clients * scenario.samples_per_client
  start = (r * n) % (len(images) - n + 1)
  ids = np.arange(start, start + n)
  return [common.client_inputs(images[ids[k::scenario.clients]], ids[k::scenario.clients])
          for k in range(scenario.clients)]


# -- models ---------------------------------------------------------------------------------------

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


def resnet18_model(image_shape) -> Callable[[], tf.keras.Model]:
  """ResNet-18 (64-512 channels, the L-DAWA and FedEMA papers' encoder) + 512-512-512 projector:
  where convolutions, not normalization, make most of a step."""
  def build():
    enc = models.build_encoder("resnet18", image_shape, width=1.0, small_input=True)
    x = tf.keras.Input(image_shape)
    return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], (512, 512, 512))(enc(x)))
  return build


MODELS = {"demo": demo_model, "mini": mini_model, "tiny": tiny_model, "resnet18": resnet18_model}


def with_precision(build: Callable[[], tf.keras.Model], precision: str) -> Callable[[], tf.keras.Model]:
  """`build` whose layers multiply in `precision` (`models.layers.PRECISIONS`, `--precision`)."""
  models.layers.PRECISION.check(precision)

  @tf.autograph.experimental.do_not_convert  # Called while a tf.function traces: Python as is.
  def build_in_precision():
    with models.layers.precision(precision):
      return build()
  return build_in_precision


# -- timing and memory ----------------------------------------------------------------------------

def median_time(fn: Callable[[int], None], warmup: int, rounds: int) -> float:
  """The median time of `fn(r)` over r = warmup .. warmup + rounds - 1, after untimed calls of
  r = 0 .. warmup - 1."""
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


def ratio(a: float, b: float) -> float:
  """a / b; NaN where b is 0."""
  return a / b if b else float("nan")


def peak_rss_mb() -> tuple[float, float]:
  """(Peak resident memory of this process, of the TFF worker process), MB."""
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
