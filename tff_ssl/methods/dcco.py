"""DCCO: Distributed Cross-Correlation Optimization (Vemulapalli et al., 2023, eq. 1-3, Appendix A), of
any statistics loss (`--ssl`: `tff_ssl.losses.STATISTICS`; CCO is the paper's, VICReg and the spectral
contrastive loss are functions of means over images too).

One round is one federated computation (`run_round`) on a local TFF worker; across workers, TFF's
mergeable execution rejects an aggregation that depends on another, so there the two phases are two
computations composed in Python (`aggregate_statistics`, `aggregate_updates`; the same values):

    SERVER  w, seed_r                                        CLIENTS k = 1..K  (N_k images each)
    ─────────────────────────────────────────────────────────────────────────────────────────────
    phase 1 (aggregate_statistics)
      w, seed_r ──federated_broadcast──►  views v1,v2 = two_views(x_k; seed_r, ids_k)
                                          F,G = projector(encoder(v1, v2; w))
                                          <>_k = loss.statistics(F, G)    (CCO: 5 means)
      <>_A = federated_mean(<>_k, weight=N_k), N = federated_sum(N_k) ◄──
    phase 2 (aggregate_updates)
      w, seed_r, <>_A ──broadcast──────►  same views;  <>_C = <>_k + stop_gradient(<>_A − <>_k)
                                          L = loss(<>_C, N);  w_k = w − η ∇_w L   (local step(s))
                                          Δ_k = w − w_k
      Δ = federated_mean(Δ_k, weight=N_k) ◄──
    server: w ← server_optimizer(w, gradient=Δ)

Phase 2 is the clients' shared local training (`client_work.local_training`) with no SSL loss of its
own and one term, `StatisticsTerm` (the loss of <>_C against the broadcast <>_A), on the round's views
at every local step. DP-DCCO's two releases go through `privacy.release`, DP-FedAvg's path.

With one local gradient-descent step and N_k weights, a round equals one centralized step on the union
of the round's images (Appendix A); `tests/methods/test_dcco.py` checks it numerically. <>_C has the
value of <>_A and the gradient of <>_k. With several local steps the local statistics are recomputed at
each step against the round's fixed <>_A (stale statistics: the paper leaves this open).

`--dcco_statistics=previous` (`DCCOConfig.statistics`): one phase. A round's clients train against the
aggregate statistics of the round before (broadcast from the server state) and release this round's
statistics beside their update (from the same forward pass), which the server averages for the next
round; the first round (and a round after no released statistics) runs both phases. A round then costs
about one centralized step instead of 4/3, and its statistics are one round stale.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import losses
from tff_ssl import data as data_lib
from tff_ssl import privacy as privacy_lib
from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.privacy import PrivacyConfig
from tff_ssl.privacy import clip as clip_lib
from tff_ssl.privacy.release import PrivateRelease, dp_event
from tff_ssl.federated import client_work, common, composer, grouping
from tff_ssl.federated import local_steps
from tff_ssl.federated import masks
from tff_ssl.federated import server_step
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.models import layers
from tff_ssl.federated.process import BuildContext
from tff_ssl.losses.statistics import combined
from tff_ssl.method import FEDERATED_FIELDS, Method

STATISTICS_MODES = ("current", "previous")
RELEASES = 2  # Under DP a round releases the clients' statistics, then their update.
DCCO_STATISTICS = Field(
    "dcco_statistics", "current", "DCCO's statistics: the round's own (current: two phases, "
    "exactly the centralized gradient) or the previous round's aggregate (previous: one phase, "
    "about one centralized step's cost, statistics one round stale).", choices=STATISTICS_MODES)

DCCO_MEAN_ANCHOR = Field(
    "dcco_mean_anchor", 0.0, "DCCO: weight of a penalty on the union's mean encodings, "
    "weight x (mean_d <f>_d^2 + mean_d <g>_d^2), added to a loss with mean statistics (CCO, VICReg). "
    "Those losses leave the means free, and with --dcco_statistics=previous a drifting mean "
    "mis-centres every one-round-old covariance; the penalty pulls the means toward 0 (measured "
    "not to make one-computation DCCO train: docs/dcco_statistics_mini.md).", lower=0,
    note="0: the loss alone")

DCCO_VARIANCE_ANCHOR = Field(
    "dcco_variance_anchor", 0.0, "DCCO: weight of a penalty on the union's per-dimension encoding "
    "variances, weight x (mean_d (var f_d - 1)^2 + mean_d (var g_d - 1)^2), added to a loss with "
    "mean and second-moment statistics (CCO, VICReg). CCO ignores each feature's scale; with "
    "--dcco_statistics=previous a feature whose spread shrank since the last round is divided by "
    "its older, larger spread, and spreads collapse; the penalty pulls them toward 1 (measured "
    "not to make one-computation DCCO train: docs/dcco_statistics_mini.md).", lower=0,
    note="0: the loss alone")

DCCO_REFRESH_EVERY = Field(
    "dcco_refresh_every", 0, "DCCO with --dcco_statistics=previous: every this many rounds, a round "
    "runs both phases (fresh statistics) instead of one.", lower=0,
    note="0: only the first round")

DP_STATISTICS_CLIP = Field("dp_statistics_clip", 1.0, "DP-DCCO: each client's L2 clip of its "
                           "encoding statistics' sum (N_k times its statistics).", lower=0,
                           note="0: no clipping, only with noise multiplier 0")
DP_STATISTICS_QUANTILE = Field(
    "dp_statistics_quantile", 0.5, "DP-DCCO with --dp=gaussian_adaptive: the fraction of clients "
    "a round whose statistics the adaptive clip aims to leave unclipped (the update's clip aims "
    "at the median). Near 1 keeps the statistics clip above the norms: a clipped statistics "
    "vector scales its means and second moments together (docs/privacy_scaling_mini.md).",
    lower=0, upper=1, open_lower=True, open_upper=True)
DP_STATISTICS_CLIP_RATE = Field(
    "dp_statistics_clip_rate", 0.2, "DP-DCCO with --dp=gaussian_adaptive: the statistics clip's "
    "geometric learning rate (a round moves it by exp(-rate (unclipped fraction - quantile)); "
    "TFF's 0.2, which the update's clip keeps). Larger follows fast-shrinking norms. 0: the "
    "statistics clip stays at --dp_statistics_clip, a fixed clip noised with the whole noise "
    "multiplier (none of it spent on a clipped count), beside the update's adaptive clip: for "
    "statistics of bounded norm (--projector_output=unit).", lower=0)



@dataclasses.dataclass(frozen=True)
class DCCOConfig:
  ssl: str = "cco"  # A statistics loss (`tff_ssl.losses.STATISTICS`).
  hparams: ssl_lib.Hparams = ssl_lib.Hparams()  # The loss's (cco_lambda, vicreg_*).
  statistics: str = "current"  # STATISTICS_MODES: this round's aggregate, or the previous round's.
  client_optimizer: str = "sgd"
  client_learning_rate: float = 1.0  # The paper: plain gradient descent at 1.0, one local step.
  local_steps: int = 1
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0
  privacy: PrivacyConfig = PrivacyConfig()  # privacy.releases is 2: the statistics, the update.
  # DP-DCCO's public denominator: the expected images per round (0: without DP, the exact N).
  denominator: float = 0.0
  mean_anchor: float = 0.0  # DCCO_MEAN_ANCHOR's weight (0: none).
  variance_anchor: float = 0.0  # DCCO_VARIANCE_ANCHOR's weight (0: none).
  refresh_every: int = 0  # DCCO_REFRESH_EVERY (0: only the first round runs both phases).
  # DP-DCCO's phase 2: clip each client in a loop even where one vectorized pass could
  # (`batched_clipping`; the reference the tests compare it with).
  clip_loop: bool = False
  # DP-DCCO's augmentation multiplicity (`--dp_augmentations`): view pairs of each image a
  # client's records average over.
  augmentations: int = 1

  def __post_init__(self):
    entry = losses.get_statistics(self.ssl)
    DCCO_STATISTICS.check(self.statistics)
    DCCO_MEAN_ANCHOR.check(self.mean_anchor)
    DCCO_VARIANCE_ANCHOR.check(self.variance_anchor)
    DCCO_REFRESH_EVERY.check(self.refresh_every)
    if self.refresh_every and not self.stale:
      raise ValueError(f"--dcco_refresh_every={self.refresh_every} refreshes one-round-old "
                       f"statistics; every two-phase round is fresh: set --dcco_statistics=previous "
                       f"or --dcco_refresh_every=0")
    if self.mean_anchor and not set(MEAN_TERMS) <= set(entry.names):
      raise ValueError(f"--dcco_mean_anchor={self.mean_anchor:g} penalizes the mean statistics "
                       f"{' and '.join(MEAN_TERMS)}, which --ssl={self.ssl} has none of (its "
                       f"statistics: {', '.join(entry.names)}): set --dcco_mean_anchor=0")
    if self.variance_anchor and not has_variances(entry.names):
      raise ValueError(f"--dcco_variance_anchor={self.variance_anchor:g} penalizes per-dimension "
                       f"variances, which --ssl={self.ssl}'s statistics ({', '.join(entry.names)}) "
                       f"do not give: set --dcco_variance_anchor=0")
    local_steps.check_client_training(self.local_steps, self.client_optimizer,
                                 self.client_learning_rate)
    if self.stale and self.privacy.any:
      raise ValueError("--dcco_statistics=previous releases each round's statistics beside its "
                       "update in one computation; DP, secure sums and compression are built for "
                       "the two-phase round: use --dcco_statistics=current")
    if self.privacy.enabled:
      if not self.denominator > 0:
        raise ValueError(f"DP-DCCO divides its noised sums by a public count of images per round; "
                         f"got denominator {self.denominator}")
    if self.augmentations < 1 or (self.augmentations > 1 and not self.privacy.enabled):
      raise ValueError(f"DP-DCCO's view pairs must be 1, or more with DP; got {self.augmentations}")


  @property
  def loss(self) -> losses.statistics.StatisticsLoss:
    return losses.get_statistics(self.ssl)

  @property
  def stale(self) -> bool:
    """Whether a round trains against the previous round's statistics (one phase)."""
    return self.statistics == "previous"


MEAN_TERMS = ("mean_f", "mean_g")  # The statistics DCCO_MEAN_ANCHOR penalizes.
# Each mean's per-dimension second moment: <x^2> itself, or the diagonal of <x x^T>.
SECOND_MOMENTS = {"mean_f": ("mean_f2", "mean_ff"), "mean_g": ("mean_g2", "mean_gg")}


def has_variances(names) -> bool:
  """Whether statistics of these names give f's and g's per-dimension variances."""
  return all(m in names and any(s in names for s in SECOND_MOMENTS[m]) for m in MEAN_TERMS)


def variances(statistics) -> list[tf.Tensor]:
  """[var f, var g], each [d]: <x^2> - <x>^2 per dimension of the statistics' encodings."""
  out = []
  for mean in MEAN_TERMS:
    square, outer = SECOND_MOMENTS[mean]
    second = (statistics[square] if square in statistics
              else tf.linalg.diag_part(statistics[outer]))
    out.append(second - tf.square(statistics[mean]))
  return out


def mean_anchor(statistics, weight: float) -> tf.Tensor:
  """weight x (mean_d <f>_d^2 + mean_d <g>_d^2) of the statistics' mean encodings."""
  return weight * tf.add_n([tf.reduce_mean(tf.square(statistics[n])) for n in MEAN_TERMS])


def variance_anchor(statistics, weight: float) -> tf.Tensor:
  """weight x (mean_d (var f_d - 1)^2 + mean_d (var g_d - 1)^2) of the statistics' encodings."""
  return weight * tf.add_n([tf.reduce_mean(tf.square(v - 1.0)) for v in variances(statistics)])


def _field(struct, name):
  return struct[name] if isinstance(struct, dict) else getattr(struct, name)


def _has(struct, name) -> bool:
  return name in struct if isinstance(struct, dict) else hasattr(struct, name)


class StatisticsTerm(client_work.ClientTerm):
  """DCCO's client loss (eq. 3) as the client's one term: the statistics loss of
  <>_C = <>_k + stop_gradient(<>_A - <>_k) over the round's aggregate <>_A and its count N.

  What it carries (`carried["dcco"]`, given by the round): {"aggregate": {"statistics": <>_A,
  "count": N}, "local": None}; after the first step "local" holds that step's <>_k (the statistics a
  client releases with `--dcco_statistics=previous`). `eps`: the loss's variance floor (None: the
  loss's own); DP-DCCO's aggregate carries its own ("eps": the loss's plus the noise's scale at the
  round's statistics clip, `DCCOProcess.variance_eps`), which then takes its place."""

  key = "dcco"

  def __init__(self, ssl: str, hparams: ssl_lib.Hparams, eps: float | None = None,
               anchor: float = 0.0, variance_anchor: float = 0.0):
    self.ssl, self.hparams, self.eps = ssl, hparams, eps
    self.anchor, self.variance_anchor = anchor, variance_anchor

  @property
  def stateful(self) -> bool:
    return True

  def loss(self, step, carried):
    local = losses.get_statistics(self.ssl).statistics(step.outputs.z1, step.outputs.z2)
    return self.value(local, carried["aggregate"]), local

  def value(self, local, aggregate) -> tf.Tensor:
    """The loss of <>_C = `local` + stop_gradient(<>_A - `local`): its value the aggregate's, its
    gradient the aggregate's loss gradient applied to `local`."""
    entry = losses.get_statistics(self.ssl)
    statistics = losses.statistics.as_statistics(entry, _field(aggregate, "statistics"))
    both = combined(local, statistics)
    eps = _field(aggregate, "eps") if _has(aggregate, "eps") else self.eps
    value = entry.loss(both, _field(aggregate, "count"), self.hparams, eps)
    if self.anchor:
      value += mean_anchor(both, self.anchor)
    if self.variance_anchor:
      value += variance_anchor(both, self.variance_anchor)
    return value

  def after_step(self, carried, step, record):
    del step
    return carried if carried["local"] is not None else dict(carried, local=record)


def client_config(cfg: DCCOConfig, eps: float | None = None) -> client_work.ClientConfig:
  """DCCO's clients as the shared client work runs them: no SSL loss but the statistics term, the
  round's views at every local step."""
  return client_work.ClientConfig(
      ssl="", terms=(StatisticsTerm(cfg.ssl, cfg.hparams, eps, cfg.mean_anchor,
                                      cfg.variance_anchor),),
      step_views=False,
      client_optimizer=cfg.client_optimizer, client_learning_rate=cfg.client_learning_rate,
      local_steps=cfg.local_steps, augment=cfg.augment, seed=cfg.seed)


def train_against(model: FunctionalModel, client: client_work.ClientConfig, weights, seed, data,
                  aggregate):
  """Phase 2 for one client (or a group's images as one batch): `client_work.local_training` against
  the round's `aggregate` ({"statistics": <>_A, "count": N}). Returns (Delta_k, the first step's
  loss, the first step's local statistics <>_k).

  The process's computations look it up by name when they are traced: `bin/benchmark --profile`
  times it on its own, `tools/xla_check.py` wraps it."""
  delta, loss, _, carried = client_work.local_training(
      model, client, weights, seed, data, carried={"dcco": {"aggregate": aggregate, "local": None}})
  return delta, loss, carried["dcco"]["local"]


def batched_clipping(cfg: DCCOConfig) -> bool:
  """Whether DP-DCCO's phase 2 clips each client's update from per-image gradients computed in
  vectorized passes (`clipped_records`): where a client's update is one plain gradient step (its
  loss is then linear in its images' statistics). Otherwise, and with `cfg.clip_loop`, each real
  client of a slot trains in turn (`grouping.fold_clients`), the reference."""
  return (not cfg.clip_loop and cfg.local_steps == 1 and cfg.client_optimizer == "sgd")


# Per-image gradients held at once by `clipped_records`: a pass takes CLIP_FLOATS // P images (P the
# model's parameters; at least one whole client). 2**27 floats (512 MB): 183 images of the demo
# model (bin/benchmark --scenarios=dp_dcco_1024x1: 1.56-1.60x the non-private round).
CLIP_FLOATS = 2 ** 27


def clipped_records(model: FunctionalModel, term: StatisticsTerm, augment, learning_rate, weights,
                    seed, data, aggregate, clip, chunk: int | None = None):
  """Phase 2 of DP-DCCO at a slot without a loop over its clients: (sum_k of client k's record N_k
  Delta_k clipped to `clip`, the records' norms before the clip [K], the loss). Delta_k as
  `train_against` gives it (the start weights minus the trained ones); the loss is every client's,
  the aggregate's.

  With one plain gradient step, Delta_k = eta grad l_k, and l_k is linear in client k's statistics
  <>_k = (1/N_k) sum_n s_n (`StatisticsTerm.value`), so N_k Delta_k = eta sum_{n in k} grad l(s_n):
  per-image gradients of the linearized loss (`linearized`: G = dL/d<> taken once at the aggregate,
  `statistics_gradient`), taken `chunk` images at a time (whole clients: a larger client alone) in
  one `tf.vectorized_map` (one image per iteration: the encoder treats images apart; convolutions
  take `layers.sliced_filter_gradients`), summed by client, clipped (`privacy.clip.factors`) and added up.
  `chunk`: images a pass (None: `CLIP_FLOATS` // P)."""
  if chunk is None:
    chunk = max(1, CLIP_FLOATS // sum(int(np.prod(s.shape)) for s in model.weight_specs))
  entry = losses.get_statistics(term.ssl)
  v1, v2 = common.views(data, seed, augment)
  segments, count = client_segments(data)
  bounds = tf.math.segment_max(tf.range(1, tf.size(segments) + 1), segments)  # Each client's end.

  gradient, value = statistics_gradient(term, aggregate)

  def one_image(views):
    with tf.GradientTape() as tape, layers.sliced_filter_gradients():
      tape.watch(weights)
      f, g = common.encode_views(model, weights, views[0][None], views[1][None])
      linear = linearized(entry, gradient, f, g)
    return tape.gradient(linear, weights), linear

  @tf.function(autograph=False)  # The loop is explicit; no per-iteration intermediates kept.
  def loop(v1, v2, segments, bounds, zero):
    eta = tf.cast(learning_rate, zero.dtype)

    def body(start, total, norms):
      fits = tf.boolean_mask(bounds, bounds <= start + chunk)
      end = tf.maximum(tf.reduce_max(tf.concat([fits, [0]], 0)),
                       tf.reduce_min(tf.boolean_mask(bounds, bounds > start)))
      grads, _ = tf.vectorized_map(one_image, (v1[start:end], v2[start:end]))
      clients = segments[start:end] - segments[start]
      count = clients[-1] + 1
      # Per client: the sum of its images' gradients (each image its own client: as they are).
      grads = tf.cond(tf.equal(count, end - start), lambda: [tf.identity(g) for g in grads],
                      lambda: [tf.math.unsorted_segment_sum(g, clients, count) for g in grads])
      chunk_norms = eta * tf.sqrt(tf.add_n([
          tf.reduce_sum(tf.square(tf.reshape(g, [count, -1])), 1) for g in grads]))
      factor = clip_lib.factors(chunk_norms, clip) * eta
      total = [t + tf.tensordot(factor, g, [[0], [0]]) for t, g in zip(total, grads)]
      norms = tf.tensor_scatter_nd_update(
          norms, (tf.range(count) + segments[start])[:, None], chunk_norms)
      return end, total, norms

    _, total, norms = tf.while_loop(
        lambda start, *_: start < tf.size(segments), body,
        (tf.constant(0), [tf.zeros(s.shape, zero.dtype) for s in model.weight_specs],
         tf.zeros([count], zero.dtype)))
    return common.flatten(total), norms

  total, norms = loop(v1, v2, segments, bounds, tf.zeros([], weights[0].dtype))
  return total, norms, value


def statistics_gradient(term: StatisticsTerm, aggregate):
  """(G, the loss): G = the loss's gradient with respect to the statistics at the aggregate, by
  which every client's loss multiplies its own statistics (`StatisticsTerm.value`)."""
  entry = losses.get_statistics(term.ssl)
  stats = losses.statistics.as_statistics(entry, _field(aggregate, "statistics"))
  with tf.GradientTape() as tape:
    tape.watch(list(stats.values()))
    value = term.value(stats, aggregate)
  return collections.OrderedDict(zip(stats, tape.gradient(value, list(stats.values())))), value


def linearized(entry, gradient, f, g) -> tf.Tensor:
  """sum over the statistics of <G_s, s(f, g)> for one image's encodings `f`, `g` ([1, d]): its
  loss's linear part, whose gradient is the client's. An outer-product statistic a b^T enters as
  a^T G b, never formed (d x d per image)."""
  total = []
  for t in entry.terms:
    a = t.of(f, g)[0]
    if t.outer is None:
      total.append(tf.reduce_sum(gradient[t.name] * a))
    else:
      total.append(tf.reduce_sum(a * tf.linalg.matvec(gradient[t.name], t.outer(f, g)[0])))
  return tf.add_n(total)


def client_segments(data):
  """(each image's client index, the number of clients) of a slot (reference mode: one client)."""
  sizes = data["sizes"] if isinstance(data, dict) and "sizes" in data else getattr(
      data, "sizes", None)
  n = tf.shape(data["images"] if isinstance(data, dict) else data.images)[0]
  if sizes is None:
    return tf.zeros([n], tf.int32), 1
  count = tf.shape(sizes)[0]
  return tf.repeat(tf.range(count), sizes), count


class DCCOProcess(server_step.ServerLoop):
  """DCCO rounds over a `FunctionalModel` (encoder + projector).

  `initialize() -> ServerState`; `next(state, clients) -> (state, metrics)` where `clients` is a list of
  `common.client_inputs(images, ids)`. The phases are exposed for inspection (`data` is one client in
  reference mode and one group of clients, `grouping.group_input_type`, in grouped mode):
    aggregate_statistics: (<w@SERVER, seed@SERVER, data@CLIENTS>
                           -> <statistics=<>_A, count=N>@SERVER)   (the loss's terms' means, Σ N_k)
    aggregate_updates:    (<w@SERVER, seed@SERVER, aggregate@SERVER, data@CLIENTS>
                           -> <update=Δ@SERVER, loss@SERVER[, next=<statistics, count>@SERVER]>)
                           (Δ one flat vector, `common.flat_type`; `compute_update` gives it back as
                           tensors; `next`: with `--dcco_statistics=previous`, this round's statistics)
    run_round:            (<w@SERVER, seed@SERVER, data@CLIENTS> -> <update=Δ@SERVER, loss@SERVER>)
                           (both phases; what a round calls unless `split_phases`)
  `split_phases`: the round shape. True: the two phases as two computations (TFF's mergeable
  execution across workers, which the run layer knows: `process.BuildContext.mergeable`).
  w crosses as one flat vector too (`common.flat_weights`).
  In grouped mode (the default, `grouping.Simulation`) a slot returns its clients' N_k-weighted mean
  statistics and update with weight sum N_k; with one local step the group's update is one batched
  pass (exact, see `grouping`), with several a loop over its clients.
  """

  def __init__(self, model: FunctionalModel, image_shape: Sequence[int],
               server_optimizer: tff.learning.optimizers.Optimizer,
               config: DCCOConfig = DCCOConfig(),
               simulation: grouping.Simulation = grouping.Simulation(),
               split_phases: bool = False):
    super().__init__(model, server_optimizer, mask=masks.TensorMask.require_all(model, "DCCO"))
    self.config = config
    self.simulation = simulation
    self.split_phases = split_phases
    self.w_type = common.flat_type(model.weight_specs)  # The weights cross TFF as one vector.
    self.data_type = (grouping.group_input_type(image_shape) if simulation.grouped
                      else common.client_input_type(image_shape))
    # The model's float type (float32; float64 under `set_floatx("float64")`): the statistics,
    # weights and counts are all of it.
    self.dtype = tf.as_dtype(self.w_type.dtype)
    self.stats_type = tff.StructWithPythonType(
        [(name, tff.TensorType(self.dtype.as_numpy_dtype, shape))
         for name, shape in config.loss.shapes(model.output_dim).items()], collections.OrderedDict)
    # What phase 2 trains against: the aggregate statistics and the images they are over.
    self.aggregate_type = tff.StructWithPythonType(
        [("statistics", self.stats_type), ("count", tff.TensorType(self.dtype.as_numpy_dtype))],
        collections.OrderedDict)
    self.client_statistics = self._client_statistics()
    self.client_update = self._client_update()
    if config.privacy.any and split_phases:
      raise ValueError("DCCO with --dp, --secure_aggregation or --compression carries its "
                       "aggregators' state through both phases of one computation; it does not "
                       "run across --workers yet")
    self.variance_eps = config.loss.eps
    self.round = self._compose()
    if config.privacy.any:  # The aggregators' state (`ServerState.aggregator_state`).
      self.private_round, self._aggregator = self.round.computation(), self.round
    else:
      self._round_computations()

  def _weight_of(self, data):
    return tf.cast(common.num_examples(data), self.dtype)

  def _client_statistics(self):
    """Phase 1 at a slot: (<>_k, N_k). The statistics are means over images, so a group's
    N_g-weighted mean over its clients is the statistics of its concatenated images."""
    model, cfg, specs = self.model, self.config, self.model.weight_specs

    @tff.tensorflow.computation(self.w_type, common.SEED_TYPE, self.data_type)
    def client_statistics(weights, seed, data):
      weights = common.unflatten_tensors(weights, specs)
      v1, v2 = common.views(data, seed, cfg.augment)
      f, g = common.encode_views(model, weights, v1, v2)
      return cfg.loss.statistics(f, g), self._weight_of(data)

    return client_statistics

  def _client_update(self):
    """Phase 2 at a slot: (Δ, N, loss[, this round's statistics where they are released]); a
    group's N_k-weighted means."""
    model, cfg, specs, dtype = self.model, self.config, self.model.weight_specs, self.dtype
    # One batched pass is exact for a group when the update is linear in the gradient (module doc).
    batched = not self.simulation.grouped or (cfg.local_steps == 1 and
                                              self.simulation.batch_one_step)
    client = client_config(cfg)
    release = cfg.stale  # Phase 2 also returns the clients' statistics (the next round's).

    @tff.tensorflow.computation(self.w_type, common.SEED_TYPE, self.aggregate_type, self.data_type)
    def client_update(weights, seed, aggregate, data):
      weights = common.unflatten_tensors(weights, specs)
      if batched:
        delta, loss, local = train_against(model, client, weights, seed, data, aggregate)
        out = (common.flatten(delta), self._weight_of(data), loss)
        return out + (local,) if release else out

      def one_client(images, ids, acc):
        delta, loss, local = train_against(model, client, weights, seed,
                                           {"images": images, "ids": ids}, aggregate)
        n = tf.cast(tf.shape(ids)[0], dtype)
        # The released statistics are summed only where they are released (d x d a client).
        released = [s + n * x for s, x in zip(acc[3], local.values())] if release else []
        return ([s + n * u for s, u in zip(acc[0], delta)], acc[1] + n, acc[2] + n * loss,
                released)

      zero = tf.constant(0.0, dtype)
      stats_zero = [tf.zeros(t.shape, dtype) for t in self.stats_type] if release else []
      sums = grouping.fold_clients(
          data, one_client, ([tf.zeros_like(w) for w in weights], zero, zero, stats_zero))
      out = (common.flatten([s / sums[1] for s in sums[0]]), sums[1], sums[2] / sums[1])
      if not release:
        return out
      return out + (collections.OrderedDict(zip(cfg.loss.names, [x / sums[1] for x in sums[3]])),)

    return client_update

  def _compose(self) -> composer.Round:
    """The round's phases (statistics, then updates) through the composer: a weighted mean of
    each, TFF's secure or compressed weighted means, or two private releases."""
    w_type, specs, cfg = self.w_type, self.model.weight_specs, self.config
    arguments = [("weights", tff.FederatedType(w_type, tff.SERVER)),
                 ("seed", tff.FederatedType(common.SEED_TYPE, tff.SERVER)),
                 ("data", tff.FederatedType(self.data_type, tff.CLIENTS))]
    if cfg.privacy.enabled:
      return composer.Round(arguments, self._private_phases(), ("update", "loss", "diagnostics"))
    release = cfg.stale  # The update phase also releases this round's statistics (the next's).
    stats_agg, update_agg, value = composer.Mean(), composer.Mean(), composer.first
    if cfg.privacy.any:  # TFF's secure or compressed weighted means (no DP).
      if cfg.privacy.secure_aggregation:
        stats_factory = update_factory = tff.learning.secure_aggregator(
            zeroing=False, clipping=False, weighted=True)
      else:
        stats_factory = tff.aggregators.MeanFactory()
        update_factory = tff.aggregators.MeanFactory(
            value_sum_factory=cfg.privacy.record_sum_factory(0.0))
      # The statistics as the clients return them (an OrderedDict: TFF's factories tf.nest them);
      # the flat update as a one-element struct.
      f32 = tff.TensorType(np.float32)
      stats_agg = composer.Factory(stats_factory.create(
          self.client_statistics.type_signature.result[0], f32))
      update_agg = composer.Factory(update_factory.create(
          tff.StructWithPythonType([w_type], list), f32))
      one_tuple = tff.tensorflow.computation(w_type)(lambda x: [x])
      value = lambda out, at: tff.federated_map(one_tuple, out[0])  # noqa: E731

    def statistics(agg, out, names):
      del names
      return collections.OrderedDict(aggregate=_with_count(agg.result, out[1]))

    def update(agg, out, names):
      del names
      result = collections.OrderedDict(
          update=agg.result[0] if cfg.privacy.any else agg.result,
          loss=tff.federated_mean(out[2], weight=out[1]))
      if release:  # This round's statistics, for the next round.
        result["next"] = _with_count(tff.federated_mean(out[3], weight=out[1]), out[1])
      return result

    outputs = ("update", "loss") + (("next",) if release else ())
    return composer.Round(arguments, [
        composer.Phase("statistics", self.client_statistics, ("weights", "seed", "data"),
                       stats_agg, ("aggregate",), statistics),
        composer.Phase("update", self.client_update, ("weights", "seed", "aggregate", "data"),
                       update_agg, outputs, update, value=value)], outputs)

  def _round_computations(self):
    """`run_round` (both phases in one computation: the weights and the data cross into TFF's
    worker once and the statistics stay there) and, for TFF's mergeable execution, which refuses
    an aggregation that depends on another, the phases alone: `aggregate_statistics` and
    `aggregate_updates` (which `--dcco_statistics=previous` calls with the previous round's)."""
    self.run_round = self.round.computation()
    self.aggregate_statistics = self.round.computation(["statistics"], outputs=["aggregate"],
                                                       single=True)
    self.aggregate_updates = self.round.computation(
        ["update"], given=[("aggregate", tff.FederatedType(self.aggregate_type, tff.SERVER))],
        order=["weights", "seed", "aggregate", "data"])

  # -- DP: both phases as private releases --------------------------------------------------------
  def _private_phases(self) -> list[composer.Phase]:
    """DP-DCCO: both phases through `privacy.release` (each real client's N_k-times value clipped
    and summed in its slot, `PrivateRelease.fold`; the sum noised over the public denominator,
    `ReleaseProcess.release`), as DP-FedAvg's update is (`aggregators.private`). Sets
    `variance_eps`."""
    cfg, privacy, sigma = self.config, self.config.privacy, self.config.privacy.sigma
    stat_specs = [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype)) for t in self.stats_type]
    # A client's values are sums over its N_k images; gaussian_adaptive's votes count clients.
    records = float(privacy.clients_per_round)
    stats_phase = PrivateRelease(privacy, sigma, cfg.denominator, stat_specs, release=0,
                                 statistics=True, records=records).create()
    update_phase = PrivateRelease(privacy, sigma, cfg.denominator,
                                  [common.flat_spec(self.model.weight_specs)], release=1,
                                  records=records).create()
    self.noise_multiplier = sigma
    # The noised <F^2> and <F>^2 are each off by about sigma C_s / D: a variance below that is
    # noise, and dividing by its square root amplifies the noise without bound (seen: losses of
    # 1e14 at sigma 1). Post-processing (free under DP): the noise's scale joins eps, at the clip
    # the round's statistics were released with (gaussian_adaptive's moves; `variance_eps`).
    self.variance_eps = cfg.loss.eps
    eps_per_clip = (0.0 if privacy.statistics_unclipped else
                    sigma * privacy.noise_scale / cfg.denominator)
    self.eps_per_clip = eps_per_clip
    self.variance_eps += eps_per_clip * privacy.clip_value(statistics=True)
    self.dp_aggregate_type = tff.StructWithPythonType(
        [("statistics", self.stats_type), ("count", tff.TensorType(self.dtype.as_numpy_dtype)),
         ("eps", tff.TensorType(self.dtype.as_numpy_dtype))],
        collections.OrderedDict)
    self.client_statistics_sum = self._client_statistics_sum(stats_phase)
    self.client_update_sum = self._client_update_sum(update_phase)
    entry, dtype, loss_eps = cfg.loss, self.dtype, cfg.loss.eps

    @tff.tensorflow.computation(tff.StructType([("value", tff.StructWithPythonType(
        [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in stat_specs], list)),
                                                ("clip", np.float32)]))
    def as_aggregate(value):
      # The noised sum over the public denominator, which is also the count; the variance floor
      # at the clip the statistics were released with.
      return collections.OrderedDict(
          statistics=collections.OrderedDict(zip(entry.names, value.value)),
          count=tf.constant(cfg.denominator, dtype),
          eps=tf.cast(loss_eps + eps_per_clip * tf.cast(value.clip, tf.float64), dtype))

    def statistics(agg, out, names):
      del out
      # This round's clip (an adaptive one moves).
      clip = stats_phase.clip(names["aggregator_states"]["statistics"])
      return collections.OrderedDict(
          aggregate=tff.federated_map(as_aggregate, tff.federated_zip(
              collections.OrderedDict(value=agg.result, clip=clip))),
          statistics_measured=agg.measurements, statistics_clip=clip)

    def update(agg, out, names):
      s, u = names["statistics_measured"], agg.measurements
      return collections.OrderedDict(
          update=agg.result[0], loss=tff.federated_mean(out[2], weight=out[1]),
          diagnostics=tff.federated_zip(collections.OrderedDict(
              statistics_norm=s.norm, statistics_clipped=s.clipped,
              statistics_clip=names["statistics_clip"], statistics_signal=s.signal_norm,
              statistics_noise=s.noise_norm,
              update_norm=u.norm, update_clipped=u.clipped,
              update_clip=update_phase.clip(names["aggregator_states"]["update"]),
              update_signal=u.signal_norm, update_noise=u.noise_norm)))

    return [
        composer.Phase("statistics", self.client_statistics_sum,
                       ("weights", "seed", "data", "params"), composer.Release(stats_phase),
                       ("aggregate", "statistics_measured", "statistics_clip"), statistics,
                       value=lambda out, at: out, weight=None),
        composer.Phase("update", self.client_update_sum,
                       ("weights", "seed", "aggregate", "data", "params"),
                       composer.Release(update_phase), ("update", "loss", "diagnostics"), update,
                       weight=None)]

  def _client_statistics_sum(self, phase):
    """Phase 1 at a slot under DP: each real client's N_k <>_k clipped to the statistics clip,
    summed (one batched pass, `StatisticsLoss.clipped_sum`), as `PrivateRelease.fold` would."""
    model, cfg, specs, release = self.model, self.config, self.model.weight_specs, phase.release

    m = cfg.augmentations

    @tff.tensorflow.computation(self.w_type, common.SEED_TYPE, self.data_type, phase.params_type)
    def client_statistics_sum(weights, seed, data, params):
      weights = common.unflatten_tensors(weights, specs)
      data = common.multiplied(data, m)
      v1, v2 = common.views(data, seed, cfg.augment)
      f, g = common.encode_views(model, weights, v1, v2)
      segments, count = client_segments(data)
      # A client's record is its images' sum over the m copies / m: the m-fold sum clipped to
      # m C, then / m (min(1, mC / |S|) S / m = min(1, C / |S / m|) S / m).
      sums, norms = cfg.loss.clipped_sum(f, g, segments, count, m * release.clip_of(params))
      return release.presummed([v / m for v in sums.values()], norms / m, params)

    return client_statistics_sum

  def _client_update_sum(self, phase):
    """Phase 2 at a slot under DP: each real client's N_k Delta_k clipped to the update clip and
    summed (`PrivateRelease.fold`), with the images and their loss."""
    model, specs, release = self.model, self.model.weight_specs, phase.release
    client = client_config(self.config, self.variance_eps)
    batched = batched_clipping(self.config)
    m = self.config.augmentations

    @tff.tensorflow.computation(self.w_type, common.SEED_TYPE, self.dp_aggregate_type,
                                self.data_type, phase.params_type)
    def client_update_sum(weights, seed, aggregate, data, params):
      weights = common.unflatten_tensors(weights, specs)
      if batched:  # With m copies an image: the m-fold record clipped to m C, then / m.
        record, norms, loss = clipped_records(model, client.terms[0], client.augment,
                                              client.client_learning_rate, weights, seed,
                                              common.multiplied(data, m), aggregate,
                                              m * release.clip_of(params))
        n = tf.cast(tf.size(client_segments(data)[0]), tf.float32)
        return (release.presummed([record / m], tf.cast(norms / m, tf.float32), params), n,
                tf.cast(loss, tf.float32))

      def one_client(images, ids, acc):
        # Its update from the mean loss over the m copies' views: the mean of the m updates.
        delta, loss, _ = train_against(model, client, weights, seed, common.multiplied(
            {"images": images, "ids": ids}, m), aggregate)
        n = tf.cast(tf.shape(ids)[0], tf.float32)
        return (release.fold(acc[0], params, [n * common.flatten(delta)]), acc[1] + n,
                acc[2] + n * loss)

      zero = tf.constant(0.0)
      start = (release.empty(), zero, zero)
      if self.simulation.grouped:
        contribution, n, loss_sum = grouping.fold_clients(data, one_client, start)
      else:
        contribution, n, loss_sum = one_client(data.images, data.ids, start)
      return contribution, n, loss_sum / n

    return client_update_sum

  def initial_method_state(self):
    """`--dcco_statistics=previous`: the aggregate statistics the next round trains against (count 0:
    none yet, so the first round runs both phases); otherwise none."""
    if not self.config.stale:
      return ()
    return collections.OrderedDict(
        statistics=collections.OrderedDict(
            (name, np.zeros(t.shape, t.dtype)) for name, t in zip(self.config.loss.names,
                                                                   self.stats_type)),
        count=np.zeros([], self.dtype.as_numpy_dtype))

  def has_previous(self, state: server_step.ServerState) -> bool:
    """Whether the round trains against the previous round's statistics: one-computation DCCO, once
    a round has released them, except every `refresh_every`-th round."""
    every = self.config.refresh_every
    return (self.config.stale and float(state.method_state["count"]) > 0 and
            not (every and state.round_num % every == 0))

  def compute_update(self, state: server_step.ServerState, clients: list[dict]) -> dict:
    """The round's aggregated update Δ and mean client loss, before the server optimizer step."""
    if not clients:
      raise ValueError("a DCCO round needs at least one client")
    seed = common.round_seed(self.config.seed, state.round_num)
    data = (grouping.pack(clients, self.simulation.group_size) if self.simulation.grouped
            else clients)
    weights = common.flat_weights(state.weights)
    if self.config.privacy.any:
      out = dict(self.private_round(weights=weights, seed=seed, data=data,
                                    aggregator_states=state.aggregator_state))
      out["aggregator_state"] = out.pop("aggregator_states")
    elif self.has_previous(state):  # One phase, against the previous round's statistics.
      out = dict(self.aggregate_updates(weights, seed, state.method_state, data))
    elif self.split_phases:  # Mergeable execution: one aggregation per computation.
      stats = self.aggregate_statistics(weights, seed, data)
      out = dict(self.aggregate_updates(weights, seed, stats, data))
    else:
      out = dict(self.run_round(weights, seed, data))
    out["update"] = common.unflatten(out["update"], self.model.weight_specs)
    return out

  def next(self, state: server_step.ServerState, clients: list[dict], *, client_ids=None, store=None):
    """One round: (new server state, metrics). DCCO keeps no client state (`client_ids` and `store`
    are accepted and not used)."""
    del client_ids, store
    out = self.compute_update(state, clients)
    new_state, metrics = self.finish_round(state, out["update"], out["loss"], len(clients),
                                           out.get("aggregator_state", ()), out.get("next"))
    if self.config.privacy.enabled:  # Both releases: the statistics, then the update.
      metrics["dp_events"] = [dp_event(out["aggregator_state"][k]) for k in ("statistics", "update")]
      # Per client (its N_k-times sums): the mean norm and the fraction the clip shortened.
      d, k = out["diagnostics"], float(len(clients))
      # Each release's noise-to-signal: the noise's norm over the clipped sum's (`release_of`).
      metrics["aggregation"] = collections.OrderedDict(
          clients=np.float32(k), statistics_norm=np.float32(d["statistics_norm"] / k),
          statistics_clipped_fraction=np.float32(d["statistics_clipped"] / k),
          statistics_clip=np.float32(d["statistics_clip"]),
          statistics_noise_to_signal=noise_to_signal(d["statistics_noise"],
                                                     d["statistics_signal"]),
          update_norm=np.float32(d["update_norm"] / k),
          update_clipped_fraction=np.float32(d["update_clipped"] / k),
          update_clip=np.float32(d["update_clip"]),
          update_noise_to_signal=noise_to_signal(d["update_noise"], d["update_signal"]))
    return new_state, metrics


def noise_to_signal(noise, signal) -> np.float32:
  """A release's noise norm over its clean sum's norm (inf for a zero sum with noise)."""
  noise, signal = float(noise), float(signal)
  return np.float32(noise / signal if signal > 0 else (np.inf if noise > 0 else 0.0))


def _with_count(statistics, weights):
  """Federated: <statistics, count=Σ N_k>@SERVER."""
  return tff.federated_zip(collections.OrderedDict(statistics=statistics,
                                                   count=tff.federated_sum(weights)))


def process_config(config) -> tuple[DCCOConfig, grouping.Simulation]:
  """DCCO's typed configs of an `ExperimentConfig` (building them validates them)."""
  private = privacy_lib.from_config(config, releases=RELEASES, statistics_clip=config.dp_statistics_clip,
                                    statistics_quantile=config.dp_statistics_quantile,
                                    statistics_clip_rate=config.dp_statistics_clip_rate)
  privacy_lib.check_simulation(private, config.simulation)
  denominator = 0.0
  if private.enabled:
    if not data_lib.PARTITIONS[config.partition].fixed_size:
      raise ValueError(f"DP-DCCO divides its noised sums by the expected images per round, public "
                       f"only where every client holds --samples_per_client images; partition "
                       f"{config.partition!r} has clients of unequal size: use a fixed-size one")
    denominator = float(config.clients_per_round * config.samples_per_client)
  return (DCCOConfig(ssl=config.ssl, hparams=ssl_lib.hparams_of(config),
                     statistics=config.dcco_statistics, client_optimizer=config.client_optimizer,
                     client_learning_rate=config.client_learning_rate,
                     local_steps=config.local_steps, augment=config.augment_config(),
                     seed=config.seed, privacy=private, denominator=denominator,
                     mean_anchor=config.dcco_mean_anchor,
                     variance_anchor=config.dcco_variance_anchor,
                     refresh_every=config.dcco_refresh_every,
                     augmentations=privacy_lib.view_pairs(config, private)),
          grouping.Simulation(mode=config.simulation, group_size=config.group_size))


def build(config, model: FunctionalModel, image_shape: Sequence[int],
          context: BuildContext = BuildContext()) -> DCCOProcess:
  dcco_config, simulation = process_config(config)
  return DCCOProcess(model, image_shape, server_step.server_optimizer_for(config, model.names),
                     dcco_config, simulation, split_phases=context.mergeable)


METHOD = Method(
    name="dcco", kind="federated",
    fields=FEDERATED_FIELDS + privacy_lib.FIELDS + (
        DP_STATISTICS_CLIP, DP_STATISTICS_QUANTILE, DP_STATISTICS_CLIP_RATE, DCCO_STATISTICS,
        DCCO_MEAN_ANCHOR, DCCO_VARIANCE_ANCHOR, DCCO_REFRESH_EVERY),
    ssl=tuple(losses.STATISTICS),
    validate=process_config, build=build, dp_releases=RELEASES,
    no_batch_heads=("DCCO's clients hold as few as one image, and its server averages their "
                    "encoding statistics as if each image were encoded alone (batch statistics "
                    "would make a client's encodings depend on its batch mates)"),
    summary="DCCO: two-phase rounds (statistics, then stop-gradient local updates) of a statistics "
            "loss (CCO, VICReg, spectral).")
