"""SimCLR (Chen et al., 2020): NT-Xent, the normalized-temperature cross-entropy loss, between the two
views' projections within the client's batch."""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.losses import per_client, statistics
from tff_ssl.ssl.base import SSLMethod

DEFAULT_TEMPERATURE = 0.1  # DCCO's setting for its contrastive baseline (Sec. 4.1).


def nt_xent_loss(z1: tf.Tensor, z2: tf.Tensor,
                 temperature: float = DEFAULT_TEMPERATURE) -> tf.Tensor:
  """Mean NT-Xent loss over the 2N anchors of two views `z1`, `z2` ([N, d] each).

  Each anchor's positive is the other view of the same sample; its negatives are the other 2N - 2
  encodings of the batch. Needs N >= 2.
  """
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")
  z1 = tf.convert_to_tensor(z1)
  z2 = tf.convert_to_tensor(z2, dtype=z1.dtype)
  statistics.check_encodings(z1, z2)
  z1 = statistics.check_batch(z1, "NT-Xent")
  z = tf.math.l2_normalize(tf.concat([z1, z2], axis=0), axis=1)
  n = tf.shape(z1)[0]
  logits = tf.matmul(z, z, transpose_b=True) / temperature
  logits -= tf.eye(2 * n, dtype=logits.dtype) * 1e9  # An anchor is not its own negative.
  positives = tf.concat([tf.range(n, 2 * n), tf.range(0, n)], axis=0)
  return tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positives, logits=logits))


def nt_xent_loss_per_client(z1: tf.Tensor, z2: tf.Tensor, sizes: tf.Tensor,
                            temperature: float = DEFAULT_TEMPERATURE) -> tf.Tensor:
  """[K] within-client NT-Xent losses: each client's anchors see only that client's 2 N_k - 2
  negatives."""
  p1, mask = per_client.pad_by_client(tf.convert_to_tensor(z1), sizes)
  p2, _ = per_client.pad_by_client(tf.convert_to_tensor(z2, p1.dtype), sizes)
  m = tf.shape(mask)[1]
  z = tf.math.l2_normalize(tf.concat([p1, p2], axis=1), axis=2)  # [K, 2m, d]
  valid = tf.concat([mask, mask], axis=1)  # [K, 2m]
  logits = tf.matmul(z, z, transpose_b=True) / temperature
  excluded = tf.eye(2 * m, dtype=logits.dtype)[None] + (1.0 - valid[:, None, :])
  logits -= tf.minimum(excluded, 1.0) * 1e9  # Not its own negative; padding is nobody's.
  positives = tf.concat([tf.range(m, 2 * m), tf.range(0, m)], axis=0)
  labels = tf.broadcast_to(positives[None], tf.shape(valid))
  ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
  return tf.reduce_sum(ce * valid, axis=1) / tf.reduce_sum(valid, axis=1)


METHOD = SSLMethod(
    name="simclr",
    loss=lambda o, hp: nt_xent_loss(o.z1, o.z2, temperature=hp.temperature),
    per_client_loss=lambda o, sizes, hp: nt_xent_loss_per_client(
        o.z1, o.z2, sizes, temperature=hp.temperature),
    hparams=("temperature",),
    fields=(Field("temperature", DEFAULT_TEMPERATURE, "Temperature of the contrastive losses "
                  "(SimCLR's NT-Xent, MoCo, MoCo v3).", lower=0, open_lower=True),),
    # --head_norm=batch: SimCLR: BN in the projector's hidden layers.
    batch_heads="hidden")
