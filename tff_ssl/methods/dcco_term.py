"""DCCO's client (`methods/dcco.py`): its one client term, `StatisticsTerm`, the loss of
<>_C = <>_k + stop_gradient(<>_A - <>_k) against the round's aggregate statistics <>_A, and phase 2
for a client (`train_against`): the shared local training (`client_work.local_training`) with that
term, the round's views at every local step. The anchors (`--dcco_mean_anchor`,
`--dcco_variance_anchor`) are penalties on the union's statistics the term adds.
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl import losses
from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field
from tff_ssl.federated import client_work
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.losses.statistics import combined

MEAN_ANCHOR = Field(
    "dcco_mean_anchor", 0.0, "DCCO: weight of a penalty on the union's mean encodings, "
    "weight x (mean_d <f>_d^2 + mean_d <g>_d^2), added to a loss with mean statistics (CCO, VICReg). "
    "Those losses leave the means free, and with --dcco_statistics=previous a drifting mean "
    "mis-centres every one-round-old covariance; the penalty pulls the means toward 0 (measured "
    "not to make one-computation DCCO train: docs/dcco_statistics_mini.md).", lower=0,
    note="0: the loss alone")

VARIANCE_ANCHOR = Field(
    "dcco_variance_anchor", 0.0, "DCCO: weight of a penalty on the union's per-dimension encoding "
    "variances, weight x (mean_d (var f_d - 1)^2 + mean_d (var g_d - 1)^2), added to a loss with "
    "mean and second-moment statistics (CCO, VICReg). CCO ignores each feature's scale; with "
    "--dcco_statistics=previous a feature whose spread shrank since the last round is divided by "
    "its older, larger spread, and spreads collapse; the penalty pulls them toward 1 (measured "
    "not to make one-computation DCCO train: docs/dcco_statistics_mini.md).", lower=0,
    note="0: the loss alone")

MEAN_TERMS = ("mean_f", "mean_g")  # The statistics MEAN_ANCHOR penalizes.
# Each mean's per-dimension second moment: <x^2> itself, or the diagonal of <x x^T>.
SECOND_MOMENTS = {"mean_f": ("mean_f2", "mean_ff"), "mean_g": ("mean_g2", "mean_gg")}


def has_variances(names) -> bool:
  """Whether statistics of these names give f's and g's per-dimension variances."""
  return all(m in names and any(s in names for s in SECOND_MOMENTS[m]) for m in MEAN_TERMS)


def check_anchors(entry: losses.statistics.StatisticsLoss, mean: float, variance: float) -> None:
  """ValueError where an anchor of weight `mean` / `variance` penalizes statistics `entry` lacks."""
  MEAN_ANCHOR.check(mean)
  VARIANCE_ANCHOR.check(variance)
  if mean and not set(MEAN_TERMS) <= set(entry.names):
    raise ValueError(f"--dcco_mean_anchor={mean:g} penalizes the mean statistics "
                     f"{' and '.join(MEAN_TERMS)}, which --ssl={entry.name} has none of (its "
                     f"statistics: {', '.join(entry.names)}): set --dcco_mean_anchor=0")
  if variance and not has_variances(entry.names):
    raise ValueError(f"--dcco_variance_anchor={variance:g} penalizes per-dimension variances, "
                     f"which --ssl={entry.name}'s statistics ({', '.join(entry.names)}) do not "
                     f"give: set --dcco_variance_anchor=0")


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


def field_of(struct, name):
  return struct[name] if isinstance(struct, dict) else getattr(struct, name)


def has_field(struct, name) -> bool:
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
    statistics = losses.statistics.as_statistics(entry, field_of(aggregate, "statistics"))
    both = combined(local, statistics)
    eps = field_of(aggregate, "eps") if has_field(aggregate, "eps") else self.eps
    value = entry.loss(both, field_of(aggregate, "count"), self.hparams, eps)
    if self.anchor:
      value += mean_anchor(both, self.anchor)
    if self.variance_anchor:
      value += variance_anchor(both, self.variance_anchor)
    return value

  def after_step(self, carried, step, record):
    del step
    return carried if carried["local"] is not None else dict(carried, local=record)


def client_config(cfg: "dcco.DCCOConfig", eps: float | None = None) -> client_work.ClientConfig:
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
