"""A toy stateful method for the tests: FedAvg whose clients keep a counter of the rounds they took
part in and a running mean of their uploads, nothing more. Written the way a new method is added:
a `ClientState`, a process from the shared pieces, and a `Method` entry (registered by the tests)."""

from __future__ import annotations

import collections

import tensorflow as tf

from tff_ssl import methods
from tff_ssl.federated import client_state
from tff_ssl.federated import fedavg_process, masks
from tff_ssl.federated import server_step
from tff_ssl.methods import fedavg
from tff_ssl.method import Method


class CounterAndMeanUpdate(client_state.ClientState):
  """count: rounds taken part in; mean_update: the running mean of the client's uploads Delta_k."""

  def __init__(self, mask: masks.TensorMask | None = None):
    self.mask = mask

  def spec(self, model):
    specs = (self.mask or masks.TensorMask.all(len(model.weight_specs))).select(model.weight_specs)
    return collections.OrderedDict(count=tf.TensorSpec([], tf.float32), mean_update=list(specs))

  def end(self, state, weights, delta, num_examples, loss, ssl_state=None, context=None):
    count = state["count"] + 1.0
    mean = [m + (d - m) / count for m, d in zip(state["mean_update"], delta)]
    return collections.OrderedDict(count=count, mean_update=mean)


def build(config, model, image_shape, context=None):
  del context  # No server training; one aggregation a round.
  fedavg_config, aggregator, simulation, _ = config.parsed  # What validate returned; no add-ons.
  return fedavg_process.FedAvgSSLProcess(model, image_shape,
                                 server_step.server_optimizer_for(config, model.names), fedavg_config,
                                 aggregator.build(model), simulation,
                                 client_state=CounterAndMeanUpdate())


METHOD = Method(name="toy_stateful", kind="federated", fields=fedavg.FIELDS,
                ssl=fedavg.METHOD.ssl, validate=fedavg.process_config, build=build,
                min_samples=fedavg.METHOD.min_samples,
                summary="FedAvg whose clients count their rounds and average their uploads.")


def register() -> None:
  if METHOD.name not in methods.METHODS:
    methods.register(METHOD)
