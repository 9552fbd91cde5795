"""DP-FedAvg: the uniform mean of clipped client updates with Gaussian noise (McMahan et al., 2018).

    Delta = (sum_k clip(Delta_k, C) + N(0, (sigma C)^2 I)) / K          (K: the clients per round)

A `StrategyFactory` whose per-client stage clips (`privacy.release.PrivateRelease.add`) and whose
server stage is TFF's `DifferentiallyPrivateFactory` (over a seeded, presummed tfp query; its records
summed by the plain, secure or encoded sum). The weights are uniform and the denominator public: a
client's N_k or loss would raise its sensitivity, so no other weighting composes with it
(`AggregatorConfig.build` refuses them). In grouped mode every real client is clipped inside its slot
before the slot sums them, so both simulation modes run one mechanism.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.aggregators.base import (ClientInfo, StrategyFactory, _check_value_type, _specs,
                                      client_info_type)
from tff_ssl.privacy import PrivacyConfig
from tff_ssl.privacy.release import PrivateRelease, dp_event


class PrivateFactory(StrategyFactory):
  """Clipped, noised, uniform mean of the clients' updates under `privacy` at noise `sigma`."""

  weighting = "uniform"
  transforms_update = True  # Each client's own update is clipped: the grouped slot loops.

  def __init__(self, privacy: PrivacyConfig, sigma: float):
    super().__init__()
    self.privacy, self.sigma = privacy, float(sigma)
    self._release = None

  @property
  def elementwise_server_stage(self) -> bool:
    return False  # The slot sends its clipped records as tensors (the query reads their norm).

  def release(self, specs: Sequence[tf.TensorSpec]) -> PrivateRelease:
    """The round's release over update tensors `specs` (one per factory)."""
    if self._release is None or self._release.value_specs != list(specs):
      self._release = PrivateRelease(self.privacy, self.sigma, self.privacy.clients_per_round,
                                     specs)
    return self._release

  # -- per client (TensorFlow) -------------------------------------------------------------------
  def initial_accumulator(self, value_specs):
    return self.release(value_specs).empty()

  def fold(self, acc, update, info: ClientInfo, argument):
    del info  # Uniform: neither N_k nor the loss enters.
    specs = [tf.TensorSpec(u.shape, u.dtype) for u in update]
    return self.release(specs).fold(acc, argument, list(update))

  def finalize(self, acc, model):
    del model
    return acc

  def as_upload(self, contribution):
    return contribution

  def contribution(self, update, info, argument):
    specs = [tf.TensorSpec(u.shape, u.dtype) for u in update]
    return self.fold(self.initial_accumulator(specs), list(update), info, argument)

  def dp_events(self, state) -> list:
    """The DP events of the round that returned aggregator state `state`."""
    return [dp_event(state["release"])]

  # -- TFF processes -----------------------------------------------------------------------------
  def client_argument_type(self, value_type):
    return self._process(_check_value_type(value_type)).params_type

  def client_argument(self, state):
    return state.release.params

  def contribution_type(self, value_type):
    process = self._process(_check_value_type(value_type))
    return tff.StructType([("record", process.record_type), ("clients", np.float32),
                           ("norm", np.float32), ("clipped", np.float32)])

  def _process(self, value_type):
    return self.release(_specs(value_type)).create()

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    value_type = _check_value_type(value_type)
    if not client_info_type(value_type).is_equivalent_to(tff.types.to_type(weight_type)):
      raise TypeError(f"{type(self).__name__} takes the ClientInfo weight of the FedAvg process; "
                      f"got {weight_type}")
    stage = self.create_grouped(value_type)
    params_type = self.client_argument_type(value_type)

    @tff.tensorflow.computation(value_type, weight_type, params_type)
    def client_fn(update, info, params):
      del info
      return self.contribution(list(update), None, params)

    @tff.federated_computation(stage.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, info):
      params = tff.federated_broadcast(self.client_argument(state))
      return stage.next(state, tff.federated_map(client_fn, (value, info, params)))

    return tff.templates.AggregationProcess(stage.initialize, next_fn)

  def create_grouped(self, value_type) -> tff.templates.AggregationProcess:
    value_type = _check_value_type(value_type)
    process = self._process(value_type)
    contribution_type = self.contribution_type(value_type)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          round=tff.federated_value(np.int32(0), tff.SERVER), release=process.initialize()))

    @tff.tensorflow.computation(np.int32)
    def increment(r):
      return r + 1

    @tff.tensorflow.computation(np.float32, np.float32, np.float32, np.float32, np.float32,
                                np.float32)
    def finish(clients, clip, norm, clipped, signal, noise):
      # The release's noise-to-signal: the noise's norm over the clipped sum's (`release_of`).
      return collections.OrderedDict(clients=clients, max_weight=1.0 / clients, dp_clip=clip,
                                     update_norm=norm / clients, clipped_fraction=clipped / clients,
                                     noise_to_signal=tf.math.divide_no_nan(noise, signal))

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(contribution_type, tff.CLIENTS))
    def next_fn(state, contributions):
      result, release_state, measured = process.release_of(state.release, contributions)
      # The count of clients is public (a fixed-size sample); reported as every strategy does.
      new_state = tff.federated_zip(collections.OrderedDict(
          round=tff.federated_map(increment, state.round), release=release_state))
      return tff.templates.MeasuredProcessOutput(
          state=new_state, result=result, measurements=tff.federated_map(finish, (
              measured.clients, measured.clip, measured.norm, measured.clipped,
              measured.signal_norm, measured.noise_norm)))

    return tff.templates.AggregationProcess(init_fn, next_fn)
