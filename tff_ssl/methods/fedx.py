"""FedX (Han et al., "FedX: Unsupervised Federated Learning with Cross Knowledge Distillation", ECCV
2022) as a client add-on (`--fedx`) to FedAvg-style methods: FedSimCLR (`--method=fedavg
--ssl=simclr`), FedBYOL, FedU, FedEMA, FedMoCo. The server is the base method's (FedAvg for FedX's own runs).

A FedX client distils two ways at each local step (`fedx_terms`, below): from the frozen
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

The whole add-on, its losses included, is this module and its line in `tff_ssl/methods/addons.py`.
Fields: `fedx`, `fedx_temperature`.

The relational loss (`relational_loss`) of two views' vectors u1, u2 ([N, d]) over anchors a ([M, d]),
all L2-normalized:

    r_v = softmax_M(u_v a^T / tau)            each image's similarity distribution over the anchors
    m   = (softmax_M(u1 a^T / tau_t) + softmax_M(u2 a^T / tau_t)) / 2
    L_rel = mean_N (KL(m || r_1) + KL(m || r_2)) / 2

with KL(m || r) = sum_M m (log m - log r), the gradient flowing through m too. This is the authors'
code (FEDX `losses.py`: `kl_div(log r, m)`, "batchmean"), which the paper calls a Jensen-Shannon
divergence; with tau_t = tau (their runs: both 0.1) m is the mixture of r_1 and r_2, and the KL's
direction is the reverse of the textbook JS (1/2 KL(r_1 || m) + 1/2 KL(r_2 || m)).

A FedX client's terms (`fedx_terms`), z = the local projections, q = the local predictions
(predictor(z)), zg = the frozen global model's projections, of views 1, 2 and of a random batch of
the client's images (the anchors, view a):

    global contrastive   NT-Xent(q1, zg2; tau)                 one direction, as the code
    local relational     L_rel(z1, z2; anchors z_a)            the anchors trained too
    global relational    L_rel(q1, q2; anchors zg_a)

each weight 1. The local contrastive term NT-Xent(z1, z2) is the base SSL method's own loss (FedSimCLR's;
FedBYOL's, FedU's, FedEMA's regression in its place).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.data.augment import augment as augmented
from tff_ssl.federated import common, grouping
from tff_ssl.federated.client_work import ClientTerm
from tff_ssl.ssl import simclr

DEFAULT_TEMPERATURE = 0.1  # FEDX main.py: the contrastive and both relational temperatures.


def relational_loss(u1: tf.Tensor, u2: tf.Tensor, anchors: tf.Tensor,
                    temperature: float = DEFAULT_TEMPERATURE,
                    target_temperature: float | None = None) -> tf.Tensor:
  """L_rel (module docstring): the mean over the N images of the two views' KL from their mean
  similarity distribution over the M anchors."""
  if temperature <= 0 or (target_temperature is not None and target_temperature <= 0):
    raise ValueError(f"relational temperatures must be > 0; got {temperature}, {target_temperature}")
  target_temperature = temperature if target_temperature is None else target_temperature
  a = tf.math.l2_normalize(anchors, axis=1)
  s1 = tf.matmul(tf.math.l2_normalize(u1, axis=1), a, transpose_b=True)
  s2 = tf.matmul(tf.math.l2_normalize(u2, axis=1), a, transpose_b=True)
  # log m from the log-softmaxes (a softmax that underflows would make log m -inf and m log m NaN).
  log_m = tf.reduce_logsumexp(tf.stack([tf.nn.log_softmax(s1 / target_temperature),
                                        tf.nn.log_softmax(s2 / target_temperature)]), 0)
  log_m -= tf.math.log(tf.constant(2.0, log_m.dtype))
  m = tf.exp(log_m)
  kl1 = tf.reduce_sum(m * (log_m - tf.nn.log_softmax(s1 / temperature)), axis=1)
  kl2 = tf.reduce_sum(m * (log_m - tf.nn.log_softmax(s2 / temperature)), axis=1)
  return tf.reduce_mean(0.5 * (kl1 + kl2))


def fedx_terms(z1, z2, q1, q2, z_anchors, global_z2, global_anchors,
               temperature: float = DEFAULT_TEMPERATURE) -> dict[str, tf.Tensor]:
  """FedX's three added terms (module docstring); the global model's outputs are constants."""
  global_z2, global_anchors = tf.stop_gradient(global_z2), tf.stop_gradient(global_anchors)
  return {"global_contrastive": simclr.nt_xent_loss(q1, global_z2, temperature),
          "local_relational": relational_loss(z1, z2, z_anchors, temperature),
          "global_relational": relational_loss(q1, q2, global_anchors, temperature)}


FEDX = Field("fedx", False, "FedAvg-style methods (FedSimCLR: --method=fedavg --ssl=simclr, FedBYOL, "
             "FedU, FedEMA, FedMoCo): add FedX's global contrastive and relational distillation "
             "terms to the clients' loss.")
TEMPERATURE = Field("fedx_temperature", DEFAULT_TEMPERATURE, "FedX: the temperature of "
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

  temperature: float = DEFAULT_TEMPERATURE
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
    terms = fedx_terms(out.z1, out.z2, out.p1, out.p2, z_anchors, global_z2,
                                  global_anchors, self.temperature)
    return tf.add_n(list(terms.values())), None


def terms(config) -> tuple[ClientTerm, ...]:
  """FedX's term where `config.fedx`."""
  return (FedXTerm(config.fedx_temperature),) if config.fedx else ()
