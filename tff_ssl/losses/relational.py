"""FedX's losses (Han et al., "FedX: Unsupervised Federated Learning with Cross Knowledge Distillation",
ECCV 2022): the relational loss, and the four terms of a FedX client's objective.

Relational loss of two views' vectors u1, u2 ([N, d]) over anchors a ([M, d]), all L2-normalized:

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

import tensorflow as tf

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
