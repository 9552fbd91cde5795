"""One private release per round: the building block of DP-FedAvg's update and DP-DCCO's two
releases.

    at each real client (inside its TFF slot)    record_k = clip(value_k, C)          (`add`)
    in the slot                                  sum of its clients' records, with the clip's
                                                 diagnostics (`fold`: the slot's contribution)
    TFF (`create`: TFF's DifferentiallyPrivateFactory over a presummed `queries.SeededQuery`)
                                                 sum over slots (plain, secure or encoded sum)
                                                 + N(0, (sigma C)^2 I), / denominator
    state@SERVER                                 the query's state (its seed, the adaptive clip)
                                                 and the params the clients clip with
                                                 (`ReleaseProcess.release_of`)

DP-FedAvg (`aggregators.private`) and DP-DCCO's two releases (`methods.dcco`) are this one path.

The params (the current clip) cross to the clients as a broadcast of `state.params`, so a grouped
slot clips each of its real clients before summing: the same mechanism as one client per slot.
"""

from __future__ import annotations

import collections
from typing import Sequence

import dp_accounting

import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.privacy import PrivacyConfig, queries


class PrivateRelease:
  """A release of values of `value_specs` (a list of `tf.TensorSpec`s) under `privacy` at noise
  multiplier `sigma`, normalized by the public `denominator`; `release`: its index in the round
  (seeds its noise apart); `statistics`: clipped at `privacy.statistics_clip` (DCCO's phase 1)."""

  def __init__(self, privacy: PrivacyConfig, sigma: float, denominator: float,
               value_specs: Sequence[tf.TensorSpec], release: int = 0, statistics: bool = False,
               bound: float | None = None, records: float | None = None):
    self.privacy, self.sigma, self.denominator = privacy, float(sigma), float(denominator)
    self.value_specs = list(value_specs)
    self.query = privacy.query(sigma, denominator, release, statistics=statistics, presummed=True,
                               value_specs=self.value_specs, records=records)
    self.clip = privacy.clip_value(statistics)
    self.adaptive = privacy.release_adaptive(statistics)
    # The secure sum's range: a record's entries lie within the clip; a slot's sum within `bound`.
    self.bound = float(bound if bound is not None else self.clip)

  # -- at the clients (TensorFlow) ---------------------------------------------------------------
  def initial_params(self):
    return self.query.derive_sample_params(self.query.initial_global_state())

  def zero(self):
    """The empty sum of records."""
    return queries.zero_record(self.query, self.initial_params(), self.value_specs)

  def add(self, acc, params, values):
    """`acc` + the clipped record of one real client's `values`."""
    return queries.clip_and_sum(self.query, params, list(values), acc)

  def clip_of(self, params) -> tf.Tensor:
    """The clip the params hold (the adaptive clip's current value)."""
    return tf.nest.flatten(params)[0]

  def empty(self):
    """The empty contribution of a slot: no records, and the clip's diagnostics at zero."""
    zero = tf.constant(0.0)
    return collections.OrderedDict(record=self.zero(), clients=zero, norm=zero, clipped=zero)

  def fold(self, acc, params, values):
    """Contribution `acc` with one more real client's clipped record of `values`, and the clip's
    diagnostics (summed without noise, outside the guarantee, as the loss is): the client's norm,
    and whether the clip shortened it."""
    norm = tf.linalg.global_norm(list(values))
    return collections.OrderedDict(
        record=self.add(acc["record"], params, values), clients=acc["clients"] + 1.0,
        norm=acc["norm"] + norm,
        clipped=acc["clipped"] + tf.cast(norm > self.clip_of(params), tf.float32))

  def presummed(self, record, norms, params):
    """The contribution of records clipped and summed in one batched pass (DCCO's statistics,
    `StatisticsLoss.clipped_sum`, and updates, `dcco_private.clipped_records`), given the clients' norms
    before the clip, as `fold` would give it. gaussian_adaptive's record also holds the clients'
    votes on the clip (tfp's quantile estimator reads only a record's norm: each vote is its
    `preprocess_record` of the norm)."""
    if self.adaptive:
      numerator = self.query.inner._numerator  # pylint: disable=protected-access
      estimator = numerator._quantile_estimator_query  # pylint: disable=protected-access
      votes = tf.map_fn(
          lambda n: estimator.preprocess_record(params.quantile_estimator_params, n),
          tf.cast(norms, tf.float32), fn_output_signature=tf.float32)
      record = numerator._SampleState(record, tf.reduce_sum(votes))  # pylint: disable=protected-access
    return collections.OrderedDict(
        record=record, clients=tf.cast(tf.size(norms), tf.float32), norm=tf.reduce_sum(norms),
        clipped=tf.reduce_sum(tf.cast(norms > self.clip_of(params), tf.float32)))

  def value_of(self, record):
    """The clipped values' part of a record (gaussian_adaptive's also holds the clip votes)."""
    return record.sum_state if self.adaptive else record

  # -- TFF ---------------------------------------------------------------------------------------
  def types(self):
    """(record type, params type) as TFF types."""
    specs = self.value_specs

    @tff.tensorflow.computation()
    def example():
      params = self.initial_params()
      zeros = [tf.zeros(s.shape, s.dtype) for s in specs]
      return self.query.inner.preprocess_record(params, zeros), params

    return example.type_signature.result[0], example.type_signature.result[1]

  def create(self) -> "ReleaseProcess":
    record_type, params_type = self.types()
    factory = tff.aggregators.DifferentiallyPrivateFactory(
        self.query, self.privacy.record_sum_factory(self.bound))
    return ReleaseProcess(factory.create(record_type), self, record_type, params_type)


class ReleaseProcess:
  """The TFF side of a `PrivateRelease`: `initialize()` (federated: the state at SERVER),
  `next(state, records@CLIENTS)` -> (result@SERVER, new state, measurements@SERVER) inside a
  federated computation, and `params(state)` (federated: what the clients clip with)."""

  def __init__(self, process, release: PrivateRelease, record_type, params_type):
    self.process, self.release = process, release
    self.record_type, self.params_type = record_type, params_type
    dp_state_type = process.initialize.type_signature.result.member
    query = release.query

    @tff.tensorflow.computation(dp_state_type.query_state)
    def params_fn(query_state):
      return query.derive_sample_params(query_state)

    @tff.tensorflow.computation(params_type)
    def clip_fn(params):
      return release.clip_of(params)

    denominator = release.denominator
    result_type = process.next.type_signature.result.result.member

    @tff.tensorflow.computation(result_type, record_type)
    def noise_fn(result, records):
      # What the noise added: the noised release times its denominator, less the clean sum.
      signal = tf.nest.flatten(release.value_of(records))
      noised = tf.nest.flatten(result)
      noise = [r * tf.cast(denominator, r.dtype) - v for r, v in zip(noised, signal)]
      return collections.OrderedDict(
          signal_norm=tf.cast(tf.linalg.global_norm(signal), tf.float32),
          noise_norm=tf.cast(tf.linalg.global_norm(noise), tf.float32))

    self._params_fn, self._clip_fn, self._noise_fn = params_fn, clip_fn, noise_fn

  def initialize(self):
    """Federated (call inside a federated computation): the state at SERVER."""
    dp = self.process.initialize()
    return tff.federated_zip(collections.OrderedDict(
        dp=dp, params=tff.federated_map(self._params_fn, dp.query_state)))

  @property
  def state_type(self):
    dp_type = self.process.initialize.type_signature.result
    return tff.FederatedType(tff.StructType([("dp", dp_type.member),
                                             ("params", self.params_type)]), tff.SERVER)

  def params(self, state):
    return state.params

  def clip(self, state):
    """Federated: the clip the clients clip with in `state` (gaussian_adaptive's moves)."""
    return tff.federated_map(self._clip_fn, state.params)

  def release_of(self, state, contributions):
    """Federated: the round's release of the slots' contributions (`PrivateRelease.fold`):
    (the noised sum over the denominator, the new state, the diagnostics <clients, clip, norm,
    clipped, signal_norm, noise_norm> with the norms and clipped counts summed over the clients),
    all at SERVER. signal_norm is the norm of the clipped records' sum, noise_norm the norm of the
    noise added to it (their ratio: the release's noise-to-signal). Like the norms and the clipped
    counts these are a simulation's diagnostics, outside the guarantee: a deployment would not
    compute the clean sum."""
    result, new_state, clip = self.next(state, contributions.record)
    measured = tff.federated_map(self._noise_fn, (result, tff.federated_sum(contributions.record)))
    return result, new_state, tff.federated_zip(collections.OrderedDict(
        clients=tff.federated_sum(contributions.clients), clip=clip,
        norm=tff.federated_sum(contributions.norm),
        clipped=tff.federated_sum(contributions.clipped), signal_norm=measured.signal_norm,
        noise_norm=measured.noise_norm))

  def next(self, state, records):
    out = self.process.next(state.dp, records)
    params = tff.federated_map(self._params_fn, out.state.query_state)
    new_state = tff.federated_zip(collections.OrderedDict(dp=out.state, params=params))
    return out.result, new_state, tff.federated_map(self._clip_fn, params)



def dp_event(state) -> dp_accounting.DpEvent:
  """The DP event of the release that produced `state` (a `ReleaseProcess` state, as a round
  returns it): what TFF's DP factory recorded (`extract_dp_event_from_state`'s reading)."""
  dp = state["dp"]
  if bool(dp.is_init_state):
    raise ValueError("the release's state is its initial one; no round has released anything")
  return dp_accounting.DpEvent.from_named_tuple(dp.dp_event)
