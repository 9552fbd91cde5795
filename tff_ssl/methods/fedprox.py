"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020) for federated
SSL: FedAvg whose clients add a proximal term to their SSL loss,

    L_k(w) = L_ssl(w; x_k) + (mu / 2) ||w - w_t||^2,      w_t the broadcast (global) model,

which keeps a client's local training near the global model where clients drift apart (non-IID data,
many local steps). Each client reports ||w - w_t|| at its last local step; the server logs the
round's mean (`fedprox_distance` in aggregation.csv). mu = 0 is FedAvg, to the bit.

The whole method is this module and one line in `tff_ssl/methods/__init__.py` (docs/adding_a_method.md): a
`ClientTerm` (the loss term, what it carries, its report and the server's measurement of it) on
FedAvg's process. The field it reads: `fedprox_mu` (the paper's mu, e.g. 0.001 to 1).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tff_ssl.federated import fedavg_process, masks, server_step
from tff_ssl.methods import fedavg
from tff_ssl.federated.client_work import ClientTerm
from tff_ssl.federated.process import BuildContext
from tff_ssl.config_fields import Field
from tff_ssl.method import Method

MU = Field("fedprox_mu", 0.01, "FedProx: the weight mu of the clients' proximal term "
           "(mu / 2) ||w - w_global||^2.", lower=0, note="0: FedAvg")
FIELDS = (MU,)


@dataclasses.dataclass(frozen=True)
class ProximalTerm(ClientTerm):
  """(mu / 2) ||w - w_t||^2 over the model's tensors (frozen ones do not move: they add 0); carries
  and reports the distance ||w - w_t|| at the start of the client's last step."""

  mu: float
  key = "fedprox"

  @property
  def stateful(self) -> bool:
    return True

  def initial(self, model):
    del model
    return {"distance": tf.constant(0.0)}

  def loss(self, step, carried):
    del carried
    squared = tf.add_n([tf.reduce_sum(tf.square(w - s)) for w, s in zip(step.current, step.start)])
    return 0.5 * self.mu * squared, tf.stop_gradient(tf.sqrt(squared))

  def after_step(self, carried, step, record):
    del carried, step
    return {"distance": record}

  def report_spec(self, model):
    del model
    return collections.OrderedDict(distance=tf.TensorSpec([], tf.float32))

  def report(self, carried, upload):
    del upload
    return collections.OrderedDict(distance=carried["distance"])

  def measurements(self, reports):
    return {"fedprox_distance": np.float32(np.mean(reports["distance"]))}


def build(config, model, image_shape, context: BuildContext = BuildContext()):
  del context  # The server trains on nothing of its own; one aggregation a round.
  client, aggregator, simulation, stages = config.parsed
  return fedavg_process.FedAvgSSLProcess(
      model, image_shape, server_step.server_optimizer_for(config, model.names),
      client.with_terms(ProximalTerm(config.fedprox_mu)), aggregator.build(model), simulation,
      stages=stages.of(model, masks.TensorMask.of_model(model)))


METHOD = Method(
    name="fedprox", kind="federated", fields=fedavg.STATELESS_FIELDS + FIELDS, ssl=fedavg.METHOD.ssl,
    validate=fedavg.process_config, build=build, min_samples=fedavg.METHOD.min_samples,
    divergence_hint=fedavg.divergence_hint,
    summary="FedProx: FedAvg whose clients add (mu / 2) ||w - w_global||^2 to their SSL loss "
            "(--fedprox_mu); each reports its distance from the global model.")
