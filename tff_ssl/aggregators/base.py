"""The shape every aggregation strategy here shares: a per-client stage and a weighted mean.

Every strategy combines the clients' updates Delta_k = w_g - w_k (the FedAvg process's convention: the
server optimizer takes the aggregate as a gradient, so server SGD at learning rate 1 sets
w_g <- w_g - Delta, the papers' "new global model") as a weighted mean of a per-client value:

    Delta = sum_k b_k v_k / sum_k b_k,        (v_k, log b_k) = client_stage(Delta_k, info_k)

where info_k = ClientInfo(num_examples=N_k, loss=L_k, model=w_g) is what a weighting may use: the
client's number of examples, its mean local training loss, and the global model it started from (every
client holds it: it was broadcast). For FedAvg v_k = Delta_k, b_k = N_k; for L-DAWA the client's
layer l enters as delta_k^(l) w_k^(l), i.e. v_k^(l) = w_g^(l) - delta_k^(l) w_k^(l).

    next(state@SERVER, Delta_k@CLIENTS, info_k@CLIENTS)                         (reference simulation)
      ──federated_map(client_stage)──►  v_k, log b_k, stats_k           at each client
      b_k = exp(log b_k)
      Delta = inner.next(v_k, b_k)       (inner: a weighted tff.aggregators factory, MeanFactory)
      measurements = finish(federated_sum(stats_k), ...)

The loss weighting, softmax(-L_k), replaces the last three lines by one `federated_aggregate` of
running means kept relative to their largest log b_k (`merge_softmax`): a max followed by a mean would
be one aggregation depending on another, which TFF's multi-worker execution refuses.

`StrategyFactory` is a `tff.aggregators.WeightedAggregationFactory` whose weight argument is the
`ClientInfo` struct (TFF lets an `AggregationProcess` take any CLIENTS-placed extra argument), so TFF's
own factories compose with it: `tff.aggregators.clipping_factory(norm, LDAWAFactory(...))` clips each
Delta_k before L-DAWA sees it (the weight passes through), and an inner factory (secure or noised
sums) replaces the weighted mean.

Grouped simulation. A TFF client slot there carries many real clients, so a per-client stage run by
the aggregator would see a group's partial sum. `client_terms` (the factored `client_stage`) is
therefore also a plain TensorFlow function that the FedAvg process runs for every real client inside
the slot; the slot folds its clients with `accumulate` (a running log-sum-exp weighted mean, exact and
overflow-free, one scaled add per parameter and client) and `finalize`s them into one
`Contribution` = (sum b_k v_k / sum b_k, log sum b_k, max log b_k, sum stats_k), and
`create_grouped` builds the server stage alone, which is then the same computation as above from
the `b_k = exp(...)` line on. A weighted mean of the slots' means is the weighted mean over clients.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.aggregators import divergence
from tff_ssl.config_fields import Field

WEIGHTINGS = ("examples", "uniform", "loss")


class ClientInfo(NamedTuple):
  """What a weighting may use about a client: the factories' weight argument."""

  num_examples: Any  # float32 N_k.
  loss: Any  # float32 L_k, the client's mean local training loss.
  model: Any  # The global model w_g the client started from (a list of tensors).


def client_info_type(value_type: tff.StructType) -> tff.StructType:
  """The TFF type of `ClientInfo` for model (update) type `value_type`."""
  return tff.StructWithPythonType([("num_examples", np.float32), ("loss", np.float32),
                                   ("model", value_type)], collections.OrderedDict)


class Contribution(NamedTuple):
  """What one client (or a grouped slot of clients) hands the server stage."""

  value: Any  # sum_k b_k v_k / sum_k b_k: a list of tensors like the model.
  log_weight: Any  # log sum_k b_k.
  max_log_weight: Any  # max_k log b_k (for the max_weight measurement).
  stats: Any  # OrderedDict of per-client measurements, summed over clients.


class Accumulator(NamedTuple):
  """A grouped slot's running weighted mean, kept in the factored form of the DAWA values
  v_k = (1 - s_k) w_g + s_k Delta_k (per tensor scale s_k; s_k = 1 for FedAvg-style strategies):

    update = sum_k b_k s_k Delta_k / sum_k b_k,   model_weight[t] = sum_k b_k (1 - s_k[t]) / sum_k b_k

  so folding a client costs one scaled add per parameter whatever the strategy; `finalize` adds the
  w_g term once per slot."""

  update: Any  # A list of tensors like the model.
  model_weight: Any  # [T] coefficient of w_g per tensor.
  log_weight: Any  # log sum_k b_k.
  max_log_weight: Any  # max_k log b_k.
  stats: Any  # OrderedDict of per-client measurements, summed over clients.


def base_log_weight(weighting: str, num_examples, loss):
  """log b_k of the paper's weightings: FedAvg N_k / N, uniform 1 / K, Loss softmax(-L_k)."""
  if weighting == "examples":
    return tf.math.log(tf.cast(num_examples, tf.float32))
  if weighting == "uniform":
    return tf.zeros_like(tf.cast(num_examples, tf.float32))
  return -tf.cast(loss, tf.float32)


def check_weighting(weighting: str) -> None:
  if weighting not in WEIGHTINGS:
    raise ValueError(f"unknown weighting {weighting!r}; choose one of {list(WEIGHTINGS)}")


class StrategyFactory(tff.aggregators.WeightedAggregationFactory, abc.ABC):
  """A weighted mean of per-client values `client_stage(Delta_k, info_k)`; see the module docstring.

  Subclasses set `weighting` and may override `client_stage` (and `stats_spec` / `finish` for the
  measurements they add). `inner` (default `tff.aggregators.MeanFactory()`) computes the weighted
  mean of the v_k with weights b_k. `measure_divergence`: also report the mean over clients of the
  whole-model cosine between w_k and w_g (the L-DAWA paper's Fig. 4 curve); it needs each client's
  own update, so the grouped simulation then trains a slot's clients one by one.

  Measurements: `clients` (real clients aggregated), `max_weight` (the largest normalized weight
  b_k / sum b: 1/K when all count alike, near 1 when one client dominates), and what subclasses add.
  """

  weighting: str = "examples"
  # False: v_k = Delta_k (the grouped simulation may then batch one-step rounds; see
  # federated/fedavg_process.py).
  transforms_update: bool = False
  # The run's privacy settings (`tff_ssl.privacy.PrivacyConfig`), set by `AggregatorConfig.build`:
  # what the process's other uploads (client reports) must respect. None: plain sums.
  wire = None

  def __init__(self, *, inner: tff.aggregators.WeightedAggregationFactory | None = None,
               measure_divergence: bool = False):
    if inner is not None and not isinstance(inner, tff.aggregators.WeightedAggregationFactory):
      raise TypeError(f"inner must be a weighted tff.aggregators factory (it receives the weights "
                      f"b_k); got {type(inner).__name__}")
    self._inner_given = inner is not None
    self._inner = inner if inner is not None else tff.aggregators.MeanFactory()
    self.measure_divergence = measure_divergence

  @property
  def elementwise_server_stage(self) -> bool:
    """Whether the server stage treats the value's entries independently (the strategies' own
    weighted means do; a given `inner` factory may not): the grouped simulation then sends a slot's
    value as one flat vector."""
    return not self._inner_given

  @property
  def needs_client_updates(self) -> bool:
    """Whether the per-client stage needs each client's own update (not only N_k and L_k)."""
    return self.transforms_update or self.measure_divergence

  # -- per client (TensorFlow) -------------------------------------------------------------------
  @property
  def shifted(self) -> bool:
    """Whether the weights need the round's max as a shift (softmax(-L_k): exp(-L_k) underflows)."""
    return self.weighting == "loss"

  def stats_spec(self, value_specs: Sequence[tf.TensorSpec]) -> collections.OrderedDict:
    """Shapes of the per-client measurements `client_stage` returns (summed over clients)."""
    del value_specs
    spec = collections.OrderedDict(clients=tf.TensorSpec([], tf.float32))
    if self.measure_divergence:
      spec["model_delta"] = tf.TensorSpec([], tf.float32)
    return spec

  def client_terms(self, update: Sequence[tf.Tensor], info: ClientInfo, round_num: tf.Tensor
                   ) -> tuple[list[tf.Tensor], tf.Tensor, collections.OrderedDict]:
    """(s_k, log b_k, stats_k) of one client: its value is v_k = (1 - s_k) w_g + s_k Delta_k per
    tensor (`divergence.scaled_update`). Default: FedAvg-style, s_k = 1 (v_k = Delta_k)."""
    del round_num
    stats = collections.OrderedDict(clients=tf.constant(1.0))
    if self.measure_divergence:
      stats["model_delta"] = divergence.model_cosine(divergence.partial_sums(update, info.model))
    ones = [tf.constant(1.0)] * len(update)
    return ones, base_log_weight(self.weighting, info.num_examples, info.loss), stats

  def client_stage(self, update: Sequence[tf.Tensor], info: ClientInfo, round_num: tf.Tensor
                   ) -> tuple[list[tf.Tensor], tf.Tensor, collections.OrderedDict]:
    """(v_k, log b_k, stats_k) of one client (what it sends in the reference simulation)."""
    scale, log_weight, stats = self.client_terms(update, info, round_num)
    value = (list(update) if not self.transforms_update
             else divergence.scaled_update(update, info.model, scale))
    return value, log_weight, stats

  def finish(self, stats: collections.OrderedDict) -> collections.OrderedDict:
    """Measurements from the summed per-client stats (server side)."""
    out = collections.OrderedDict(clients=stats["clients"])
    if "model_delta" in stats:  # Mean over clients of cos(w_g, w_k), the paper's Fig. 4.
      out["model_delta"] = stats["model_delta"] / stats["clients"]
    return out

  # -- folding a slot's clients (TensorFlow) -----------------------------------------------------
  def initial_accumulator(self, value_specs: Sequence[tf.TensorSpec]) -> Accumulator:
    """The empty running sum of `accumulate` (log weights at -inf: no client yet)."""
    stats = collections.OrderedDict(
        (k, tf.zeros(s.shape, s.dtype)) for k, s in self.stats_spec(value_specs).items())
    neg_inf = tf.constant(-np.inf, tf.float32)
    return Accumulator([tf.zeros(s.shape, s.dtype) for s in value_specs],
                       tf.zeros([len(value_specs)], tf.float32), neg_inf, neg_inf, stats)

  @staticmethod
  def accumulate(acc: Accumulator, update, scale, log_weight, stats) -> Accumulator:
    """Adds one client (its Delta_k and `client_terms`) to a running weighted mean kept relative to
    the largest log weight so far: exact, and free of exp overflow for any loss scale."""
    top = tf.maximum(acc.log_weight, log_weight)
    keep = tf.exp(acc.log_weight - top)  # 0 for the empty accumulator.
    new = tf.exp(log_weight - top)
    total = keep + new
    c_keep, c_new = keep / total, new / total
    scale = tf.stack([tf.cast(x, tf.float32) for x in scale])
    merged = [c_keep * a + (c_new * scale[t]) * u
              for t, (a, u) in enumerate(zip(acc.update, update))]
    return Accumulator(merged, c_keep * acc.model_weight + c_new * (1.0 - scale),
                       top + tf.math.log(total), tf.maximum(acc.max_log_weight, log_weight),
                       collections.OrderedDict((k, acc.stats[k] + stats[k]) for k in acc.stats))

  def fold(self, acc: Accumulator, update, info: ClientInfo, argument) -> Accumulator:
    """`acc` with one real client added (its `client_terms`, then `accumulate`): what a grouped slot
    does per client. `argument`: what the clients read of the aggregator's state
    (`client_argument`; the round by default)."""
    scale, log_weight, stats = self.client_terms(update, info, argument)
    return self.accumulate(acc, update, scale, log_weight, stats)

  def finalize(self, acc: Accumulator, model) -> Contribution:
    """The slot's `Contribution`: sum_k b_k v_k / sum_k b_k with the w_g term added once."""
    value = (list(acc.update) if not self.transforms_update else
             [u + acc.model_weight[t] * g for t, (u, g) in enumerate(zip(acc.update, model))])
    return Contribution(value, acc.log_weight, acc.max_log_weight, acc.stats)

  def contribution(self, update, info: ClientInfo, round_num) -> Contribution:
    """One client's `Contribution` (`client_stage` in the server stage's terms)."""
    value, log_weight, stats = self.client_stage(update, info, round_num)
    return Contribution(value, log_weight, log_weight, stats)

  def as_upload(self, contribution: Contribution):
    """What a slot sends for its `finalize`d contribution (a struct of tensors)."""
    return _as_struct(contribution)

  # -- what the clients read of the state --------------------------------------------------------
  def client_argument_type(self, value_type) -> tff.Type:
    """The type of `client_argument` (default: the round number)."""
    del value_type
    return tff.TensorType(np.int32)

  def client_argument(self, state):
    """In a federated computation: the SERVER value of the aggregator's `state` its per-client stage
    reads, broadcast to the clients (default: the round; DP: the clip)."""
    return state.round

  # -- TFF processes -----------------------------------------------------------------------------
  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    """The strategy over one client per TFF client: `weight_type` must be `client_info_type`.

      next: (<state@SERVER, Delta_k@CLIENTS, ClientInfo@CLIENTS> ->
             <state@SERVER, result=Delta@SERVER, measurements@SERVER>)
    """
    value_type = _check_value_type(value_type)
    if not client_info_type(value_type).is_equivalent_to(tff.types.to_type(weight_type)):
      raise TypeError(f"{type(self).__name__} weighs clients by their ClientInfo "
                      f"(tff_ssl.aggregators.client_info_type(value_type)); got weight type "
                      f"{weight_type}. Plain N_k weights: use tff.aggregators.MeanFactory")
    specs = _specs(value_type)
    contribution_type = self._contribution_type(value_type, specs)

    @tff.tensorflow.computation(value_type, weight_type, np.int32)
    def client_fn(update, info, round_num):
      c = self.contribution(list(update), ClientInfo(info["num_examples"], info["loss"],
                                                     list(info["model"])), round_num)
      return _as_struct(c)

    stage = _server_stage(self, value_type, contribution_type, specs)

    @tff.federated_computation(stage.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, info):
      round_at_clients = tff.federated_broadcast(self.client_argument(state))
      contributions = tff.federated_map(client_fn, (value, info, round_at_clients))
      return stage.next(state, contributions)

    return tff.templates.AggregationProcess(stage.initialize, next_fn)

  def create_grouped(self, value_type) -> tff.templates.AggregationProcess:
    """The server stage alone, for slots that ran `client_stage` per client and folded them with
    `accumulate` (the grouped simulation). Its state is the same as `create`'s.

      next: (<state@SERVER, Contribution@CLIENTS> -> <state, result=Delta@SERVER, measurements>)
    """
    value_type = _check_value_type(value_type)
    specs = _specs(value_type)
    return _server_stage(self, value_type, self._contribution_type(value_type, specs), specs)

  def contribution_type(self, value_type) -> tff.StructType:
    """The TFF type of a `Contribution` for model type `value_type` (a grouped slot's output)."""
    value_type = _check_value_type(value_type)
    return self._contribution_type(value_type, _specs(value_type))

  def _contribution_type(self, value_type, specs) -> tff.StructType:
    stats = tff.StructType([(k, tff.TensorType(s.dtype.as_numpy_dtype, s.shape))
                            for k, s in self.stats_spec(specs).items()])
    return tff.StructType([("value", value_type), ("log_weight", np.float32),
                           ("max_log_weight", np.float32), ("stats", stats)])


def _server_stage(factory: "StrategyFactory", value_type, contribution_type,
                  specs) -> tff.templates.AggregationProcess:
  """The server stage of `factory`'s aggregation: its state (round, inner factory's), the clients'
  folded contributions summed and finished into the weighted mean."""
  inner = factory._inner.create(value_type, tff.TensorType(np.float32))
  if factory.shifted and factory._inner_given:
    raise TypeError(f"{type(factory).__name__} with weighting {factory.weighting!r} computes its "
                    f"softmax-weighted mean itself, in one mergeable aggregation; an inner "
                    f"factory cannot take its place (leave inner unset)")

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(collections.OrderedDict(
        round=tff.federated_value(np.int32(0), tff.SERVER), inner=inner.initialize()))

  @tff.tensorflow.computation(np.float32)
  def weight_fn(log_weight):
    return tf.exp(log_weight)

  @tff.tensorflow.computation(np.int32)
  def increment(r):
    return r + 1

  stats_type = contribution_type.stats

  @tff.tensorflow.computation(stats_type, np.float32)
  def finish_fn(stats, max_weight):
    out = factory.finish(collections.OrderedDict(
        (k, getattr(stats, k)) for k in factory.stats_spec(specs)))
    out["max_weight"] = max_weight  # The most any one client counted: max_k b_k / sum_k b_k.
    return out

  @tff.tensorflow.computation(np.float32, np.float32)
  def max_weight_fn(top, total):
    return tf.exp(top) / total

  # The softmax's one-pass aggregate: (value, m, s, stats) = a weighted mean of the clients so far,
  # their largest log weight m and s = sum_k exp(log b_k - m) (relative to m, so that the weights'
  # ratios are exact differences of the clients' own log weights, never of a rounded log total).
  acc_type = tff.StructType([("value", value_type), ("top", np.float32), ("total", np.float32),
                             ("stats", stats_type)])

  @tff.tensorflow.computation()
  def empty():
    return _softmax_acc([tf.zeros(s.shape, s.dtype) for s in specs],
                        tf.constant(-np.inf, tf.float32), tf.constant(0.0, tf.float32),
                        collections.OrderedDict((k, tf.zeros(s.shape, s.dtype))
                                                for k, s in factory.stats_spec(specs).items()))

  def read_acc(a):
    return (list(a.value), a.top, a.total,
            collections.OrderedDict(tff.structure.to_elements(a.stats)))

  @tff.tensorflow.computation(acc_type, contribution_type)
  def accumulate(a, c):
    # A client (or a grouped slot) as an accumulator: m = its largest log weight, s = its total
    # relative to it (exactly 1 for one client).
    stats = collections.OrderedDict(tff.structure.to_elements(c.stats))
    relative = tf.where(tf.math.is_finite(c.max_log_weight),
                        tf.exp(c.log_weight - c.max_log_weight), 0.0)  # 0: a slot of no clients.
    one = (list(c.value), c.max_log_weight, relative, stats)
    return merge_softmax(read_acc(a), one)

  @tff.tensorflow.computation(acc_type, acc_type)
  def merge(a, b):
    return merge_softmax(read_acc(a), read_acc(b))

  @tff.tensorflow.computation(acc_type)
  def report(a):
    value, _, total, stats = read_acc(a)
    return collections.OrderedDict(value=value, max_weight=tf.math.divide_no_nan(1.0, total),
                                   stats=stats)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(contribution_type, tff.CLIENTS))
  def next_fn(state, contributions):
    if factory.shifted:
      # softmax(-L_k) needs the round's largest -L_k as a shift; a max followed by a weighted mean
      # would be an aggregation depending on another, which TFF's multi-worker execution
      # (bin/train --workers) refuses. One `federated_aggregate` of running weighted means kept
      # relative to their largest log weight (flash attention's online softmax) is the same
      # softmax, exact and overflow-free, in one pass.
      total = tff.federated_aggregate(contributions, empty(), accumulate, merge, report)
      result, inner_state = total.value, state.inner
      max_weight, stats = total.max_weight, total.stats
    else:
      weights = tff.federated_map(weight_fn, contributions.log_weight)
      out = inner.next(state.inner, contributions.value, weights)
      result, inner_state = out.result, out.state
      max_weight = tff.federated_map(max_weight_fn, (
          tff.federated_max(contributions.max_log_weight), tff.federated_sum(weights)))
      stats = tff.federated_sum(contributions.stats)
    measurements = tff.federated_map(finish_fn, (stats, max_weight))
    new_state = tff.federated_zip(collections.OrderedDict(
        round=tff.federated_map(increment, state.round), inner=inner_state))
    return tff.templates.MeasuredProcessOutput(state=new_state, result=result,
                                               measurements=measurements)

  return tff.templates.AggregationProcess(init_fn, next_fn)


def _softmax_acc(value, top, total, stats) -> collections.OrderedDict:
  return collections.OrderedDict(value=list(value), top=top, total=total, stats=stats)


def merge_softmax(a, b) -> collections.OrderedDict:
  """Two softmax accumulators, tuples (value, m, s, stats), as one (an OrderedDict): each side is rescaled by exp(m_side - m)
  with m the larger, so nothing overflows whatever the losses' scale; an empty side (m = -inf,
  s = 0) contributes nothing."""
  (va, ma, sa, sta), (vb, mb, sb, stb) = a, b
  top = tf.maximum(ma, mb)
  ref = tf.where(tf.math.is_finite(top), top, 0.0)
  ka, kb = sa * tf.exp(ma - ref), sb * tf.exp(mb - ref)
  total = ka + kb
  ca, cb = tf.math.divide_no_nan(ka, total), tf.math.divide_no_nan(kb, total)
  return _softmax_acc([ca * x + cb * y for x, y in zip(va, vb)], top, total,
                      collections.OrderedDict((k, sta[k] + stb[k]) for k in sta))


def _check_value_type(value_type) -> tff.StructType:
  value_type = tff.types.to_type(value_type)
  if not isinstance(value_type, tff.StructType) or not all(
      isinstance(t, tff.TensorType) and np.issubdtype(t.dtype, np.floating)
      for t in tff.structure.flatten(value_type)) or any(
          isinstance(t, tff.StructType) for t in value_type):
    raise TypeError(f"the aggregated value must be a flat struct of float tensors (a model's "
                    f"weights or update); got {value_type}")
  return value_type


def _specs(value_type: tff.StructType) -> list[tf.TensorSpec]:
  return [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype)) for t in value_type]


def _as_struct(c: Contribution) -> collections.OrderedDict:
  return collections.OrderedDict(value=list(c.value), log_weight=c.log_weight,
                                 max_log_weight=c.max_log_weight, stats=c.stats)


@dataclasses.dataclass(frozen=True)
class ModelLayout:
  """Which layer each weight tensor belongs to, and which tensors are normalization parameters.

  `groups[t]`: the name of tensor t's group (its Keras layer, or the tensor itself); tensors of one
  group share one angular divergence in L-DAWA.
  """

  groups: tuple[str, ...]
  normalization: tuple[bool, ...]

  def __post_init__(self):
    if len(self.groups) != len(self.normalization):
      raise ValueError(f"a layout needs one group and one normalization flag per tensor; got "
                       f"{len(self.groups)} and {len(self.normalization)}")

  @classmethod
  def from_model(cls, model, granularity: str = "layer", mask=None) -> "ModelLayout":
    """The layout of a `FunctionalModel`: per Keras layer ("layer") or per tensor ("tensor"), of the
    tensors a `TensorMask` selects (default all: the tensors a process exchanges)."""
    GRANULARITY.check(granularity)
    groups = list(model.layer_names if granularity == "layer" else model.names)
    normalization = list(model.normalization)
    if mask is not None:
      mask.check(len(groups))
      groups, normalization = mask.select(groups), mask.select(normalization)
    return cls(tuple(groups), tuple(normalization))

  @classmethod
  def per_tensor(cls, num_tensors: int) -> "ModelLayout":
    return cls(tuple(f"tensor{i}" for i in range(num_tensors)), (False,) * num_tensors)

  @property
  def names(self) -> tuple[str, ...]:
    """The groups in order of first appearance."""
    return tuple(dict.fromkeys(self.groups))

  @property
  def group_index(self) -> tuple[int, ...]:
    index = {name: i for i, name in enumerate(self.names)}
    return tuple(index[g] for g in self.groups)


GRANULARITIES = ("layer", "tensor")

# The strategies' options as config fields (their one check; `AggregatorConfig` reads them).
GRANULARITY = Field("aggregator_granularity", "layer", "L-DAWA family: one angle per Keras layer, "
                    "or per weight tensor.", choices=GRANULARITIES)
SCALE_NORMALIZATION = Field("scale_normalization", False, "L-DAWA family: scale GroupNorm tensors "
                            "by their angle too (the authors' code; the paper: no).")
FEDAVG_WARMUP_ROUNDS = Field("fedavg_warmup_rounds", 0, "DAWA family: aggregate the first rounds "
                             "with plain FedAvg (the authors' code).", lower=0)
MEASURE_DIVERGENCE = Field("measure_divergence", False, "fedavg/uniform/loss: also report the mean "
                           "cosine between client and global models (aggregation.csv).")
