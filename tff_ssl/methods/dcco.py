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
from tff_ssl import privacy as privacy_lib
from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field
from tff_ssl.data.augment import AugmentConfig
from tff_ssl.privacy import PrivacyConfig
from tff_ssl.privacy.release import dp_event
from tff_ssl.federated import client_work, common, composer, grouping
from tff_ssl.federated import local_steps
from tff_ssl.federated import masks
from tff_ssl.federated import server_step
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.process import BuildContext
from tff_ssl.method import FEDERATED_FIELDS, Method
from tff_ssl.methods import dcco_private, dcco_term

STATISTICS_MODES = ("current", "previous")
RELEASES = 2  # Under DP a round releases the clients' statistics, then their update.
DCCO_STATISTICS = Field(
    "dcco_statistics", "current", "DCCO's statistics: the round's own (current: two phases, "
    "exactly the centralized gradient) or the previous round's aggregate (previous: one phase, "
    "about one centralized step's cost, statistics one round stale).", choices=STATISTICS_MODES)

DCCO_REFRESH_EVERY = Field(
    "dcco_refresh_every", 0, "DCCO with --dcco_statistics=previous: every this many rounds, a round "
    "runs both phases (fresh statistics) instead of one.", lower=0,
    note="0: only the first round")


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
  mean_anchor: float = 0.0  # dcco_term.MEAN_ANCHOR's weight (0: none).
  variance_anchor: float = 0.0  # dcco_term.VARIANCE_ANCHOR's weight (0: none).
  refresh_every: int = 0  # DCCO_REFRESH_EVERY (0: only the first round runs both phases).
  # DP-DCCO's phase 2: clip each client in a loop even where one vectorized pass could
  # (`batched_clipping`; the reference the tests compare it with).
  clip_loop: bool = False
  # DP-DCCO's augmentation multiplicity (`--dp_augmentations`): view pairs of each image a
  # client's records average over.
  augmentations: int = 1
  # DP-DCCO's phase-2 client norms (`--dp_norms`): "per_image" or "ghost".
  norms: str = "per_image"

  def __post_init__(self):
    entry = losses.get_statistics(self.ssl)
    DCCO_STATISTICS.check(self.statistics)
    DCCO_REFRESH_EVERY.check(self.refresh_every)
    if self.refresh_every and not self.stale:
      raise ValueError(f"--dcco_refresh_every={self.refresh_every} refreshes one-round-old "
                       f"statistics; every two-phase round is fresh: set --dcco_statistics=previous "
                       f"or --dcco_refresh_every=0")
    dcco_term.check_anchors(entry, self.mean_anchor, self.variance_anchor)
    local_steps.check_client_training(self.local_steps, self.client_optimizer,
                                      self.client_learning_rate)
    dcco_private.check(self)

  @property
  def loss(self) -> losses.statistics.StatisticsLoss:
    return losses.get_statistics(self.ssl)

  @property
  def stale(self) -> bool:
    """Whether a round trains against the previous round's statistics (one phase)."""
    return self.statistics == "previous"


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
    client = dcco_term.client_config(cfg)
    release = cfg.stale  # Phase 2 also returns the clients' statistics (the next round's).

    @tff.tensorflow.computation(self.w_type, common.SEED_TYPE, self.aggregate_type, self.data_type)
    def client_update(weights, seed, aggregate, data):
      weights = common.unflatten_tensors(weights, specs)
      if batched:
        delta, loss, local = dcco_term.train_against(model, client, weights, seed, data, aggregate)
        out = (common.flatten(delta), self._weight_of(data), loss)
        return out + (local,) if release else out

      def one_client(images, ids, acc):
        delta, loss, local = dcco_term.train_against(model, client, weights, seed,
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
      return composer.Round(arguments, dcco_private.private_phases(self),
                            ("update", "loss", "diagnostics"))
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
      metrics["aggregation"] = dcco_private.measurements(out["diagnostics"], len(clients))
    return new_state, metrics


def _with_count(statistics, weights):
  """Federated: <statistics, count=Σ N_k>@SERVER."""
  return tff.federated_zip(collections.OrderedDict(statistics=statistics,
                                                   count=tff.federated_sum(weights)))


def process_config(config) -> tuple[DCCOConfig, grouping.Simulation]:
  """DCCO's typed configs of an `ExperimentConfig` (building them validates them)."""
  private, denominator = dcco_private.from_config(config, RELEASES)
  return (DCCOConfig(ssl=config.ssl, hparams=ssl_lib.hparams_of(config),
                     statistics=config.dcco_statistics, client_optimizer=config.client_optimizer,
                     client_learning_rate=config.client_learning_rate,
                     local_steps=config.local_steps, augment=config.augment_config(),
                     seed=config.seed, privacy=private, denominator=denominator,
                     mean_anchor=config.dcco_mean_anchor,
                     variance_anchor=config.dcco_variance_anchor,
                     refresh_every=config.dcco_refresh_every,
                     augmentations=privacy_lib.view_pairs(config, private),
                     norms=config.dp_norms),
          grouping.Simulation(mode=config.simulation, group_size=config.group_size))


def build(config, model: FunctionalModel, image_shape: Sequence[int],
          context: BuildContext = BuildContext()) -> DCCOProcess:
  dcco_config, simulation = config.parsed
  return DCCOProcess(model, image_shape, server_step.server_optimizer_for(config, model.names),
                     dcco_config, simulation, split_phases=context.mergeable)


METHOD = Method(
    name="dcco", kind="federated",
    fields=FEDERATED_FIELDS + privacy_lib.FIELDS + (
        *dcco_private.FIELDS, DCCO_STATISTICS,
        dcco_term.MEAN_ANCHOR, dcco_term.VARIANCE_ANCHOR, DCCO_REFRESH_EVERY),
    ssl=tuple(losses.STATISTICS),
    validate=process_config, build=build, dp_releases=RELEASES,
    no_batch_heads=("DCCO's clients hold as few as one image, and its server averages their "
                    "encoding statistics as if each image were encoded alone (batch statistics "
                    "would make a client's encodings depend on its batch mates)"),
    summary="DCCO: two-phase rounds (statistics, then stop-gradient local updates) of a statistics "
            "loss (CCO, VICReg, spectral).")
