"""FedX (Han et al., "FedX: Unsupervised Federated Learning with Cross Knowledge Distillation", ECCV
2022) as a client add-on (`--fedx`) to FedAvg-style methods: FedSimCLR (`--method=fedavg
--ssl=simclr`), FedBYOL, FedU, FedEMA, FedMoCo. The server is the base method's (FedAvg for FedX's own runs).

A FedX client distils two ways at each local step (`tff_ssl.losses.relational`): from the frozen
global model of the round (the broadcast one, even where the client's state starts its training
elsewhere: FedU's kept predictor, FedEMA's mix) and from its own model over a random batch of its
own images (the anchors):

    L = L_ssl(z1, z2)                         the base method's loss (FedSimCLR: NT-Xent(z1, z2))
      + NT-Xent(q1, zg2; tau)                 global contrastive: local prediction vs global projection
      + L_rel(z1, z2; anchors z_a)            local relational
      + L_rel(q1, q2; anchors zg_a)           global relational

q = predictor(z): the model gains a predictor head where its SSL method has none, sized by
`--predictor` (default 512 -> the projection's size; FedX's code: 256 -> 256 on a 256-d projection). The
anchors: as many images as the step's batch, drawn from the client's images without replacement by
the step's seed, one augmented view each. tau = 0.1 for every term and weight 1 (FEDX `main.py`);
their JS as their code computes it (`relational_loss`).

The whole add-on is this module and its line in `tff_ssl/methods/addons.py`. Fields: `fedx`,
`fedx_temperature`.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.data.augment import augment as augmented
from tff_ssl.federated import common, grouping
from tff_ssl.federated.client_work import ClientTerm
from tff_ssl.losses import relational

FEDX = Field("fedx", False, "FedAvg-style methods (FedSimCLR: --method=fedavg --ssl=simclr, FedBYOL, "
             "FedU, FedEMA, FedMoCo): add FedX's global contrastive and relational distillation "
             "terms to the clients' loss.")
TEMPERATURE = Field("fedx_temperature", relational.DEFAULT_TEMPERATURE, "FedX: the temperature of "
                    "its contrastive and relational terms.", lower=0, open_lower=True)
FIELDS = (FEDX, TEMPERATURE)  # --predictor sizes the head a SimCLR model gains (`has_predictor`).

ANCHOR_SALT = 0x0FED  # Folded into the step's seed: the anchors' draw and views, apart from the step's.


def anchor_batch(data, seed, size, augment) -> tf.Tensor:
  """`size` images (at most all the client holds) of the client's `data`, drawn without replacement
  by `seed`, one augmented view each."""
  images, ids = grouping.field(data, "images"), grouping.field(data, "ids")
  seed = tf.random.experimental.stateless_fold_in(seed, ANCHOR_SALT)
  n = tf.shape(ids)[0]
  order = tf.argsort(tf.random.stateless_uniform([n], seed))[:tf.minimum(size, n)]
  return augmented(tf.gather(images, order), seed, augment, tf.gather(ids, order))


@dataclasses.dataclass(frozen=True)
class FedXTerm(ClientTerm):
  """FedX's three added terms (module docstring); records each (their sum is the term's loss)."""

  temperature: float = relational.DEFAULT_TEMPERATURE
  key = "fedx"
  predictions = True

  def loss(self, step, carried):
    del carried
    if step.data is None:
      raise ValueError("FedX draws its anchors from the client's images; this step has none")
    out = step.outputs
    anchors = anchor_batch(step.data, step.seed, tf.shape(step.v1)[0], step.augment)
    z_anchors = step.model(list(step.current), anchors, training=True)[0]
    with common.batch_segments(2):  # Batch-statistics heads: view 2 and the anchors apart.
      global_out = step.model(list(step.global_weights), tf.concat([step.v2, anchors], 0),
                              training=True)[0]
    global_z2, global_anchors = tf.split(global_out, [tf.shape(step.v2)[0], -1])
    terms = relational.fedx_terms(out.z1, out.z2, out.p1, out.p2, z_anchors, global_z2,
                                  global_anchors, self.temperature)
    return tf.add_n(list(terms.values())), None


def terms(config) -> tuple[ClientTerm, ...]:
  """FedX's term where `config.fedx`."""
  return (FedXTerm(config.fedx_temperature),) if config.fedx else ()
