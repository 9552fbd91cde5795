"""MoCo v3's contrastive loss (Chen, Xie and He, 2021, "An empirical study of training self-supervised
Vision Transformers"): no queue; the other images of the batch are the negatives.

A query q (the online network's prediction of one view) is contrasted with the momentum network's
projections k of the other view of every image in the batch, all l2-normalized; its own image's key is
the positive:

    ctr(q, k) = 2 t * mean_i CE(softmax_j(q_i . k_j / t), i),    loss = ctr(q1, k2) + ctr(q2, k1).

The 2 t factor is MoCo v3's (it makes the gradient's scale independent of t). Keys are
stop-gradiented: the momentum network is the EMA of the online one (LW-FedSSL: decay 0.99, t = 0.2).
Each anchor's negatives are the batch's other keys, so a client needs at least 2 images.
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.losses.byol import check_pairs
from tff_ssl.losses.moco import unit

DEFAULT_TEMPERATURE = 0.2


def info_nce(q: tf.Tensor, k: tf.Tensor, temperature: float) -> tf.Tensor:
  """mean_i -log( exp(q_i . k_i / t) / sum_j exp(q_i . k_j / t) ), q and k l2-normalized: each query
  against the batch's keys, its own image's the positive; keys are constants (stop-gradient)."""
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")
  q = tf.convert_to_tensor(q)
  k = tf.convert_to_tensor(k, q.dtype)
  check_pairs(q, k)
  logits = tf.matmul(unit(q), tf.stop_gradient(unit(k)), transpose_b=True) / temperature
  labels = tf.range(tf.shape(q)[0])
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                       logits=logits))


def contrastive_loss(q: tf.Tensor, k: tf.Tensor, temperature: float) -> tf.Tensor:
  """ctr(q, k): 2 t times the mean cross-entropy of each query against the batch's keys."""
  return 2.0 * temperature * info_nce(q, k, temperature)


def alignment_loss(local: tf.Tensor, global_: tf.Tensor, temperature: float) -> tf.Tensor:
  """LW-FedSSL's representation alignment (its Eq. 3, InfoNCE as its Eq. 2, without MoCo v3's 2 t):
  each image's local representation (the local encoder on view 1) against the global encoder's
  representations of view 2 of every image in the batch (`info_nce`); the global representations
  are constants: only the local encoder is trained."""
  return info_nce(local, global_, temperature)


def mocov3_loss(p1, p2, t1, t2, temperature: float = DEFAULT_TEMPERATURE) -> tf.Tensor:
  """Symmetrized MoCo v3 loss: predictions p1, p2 of the two views against the momentum
  projections t2, t1 of the other view."""
  return contrastive_loss(p1, t2, temperature) + contrastive_loss(p2, t1, temperature)
