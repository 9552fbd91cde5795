"""MoCo (He et al., 2020; v2: Chen et al., 2020): the online projection of one view is contrasted with
the momentum (target) network's projection of the other view against a queue of `moco_queue` earlier
keys, symmetrized over the views. The momentum network is the EMA of the online one over local steps
(decay `target_decay`), as BYOL's target. v1 and v2 differ in the projection head (linear vs MLP:
`--projector`) and the temperature (0.07 vs 0.2: `--temperature`) and augmentations. FedAvg-style
clients start each round with the broadcast model as momentum network and a zero queue; FedMoCo's
clients keep both between rounds (`tff_ssl.methods.fedmoco`).

The loss: a query q is contrasted with its key k+ against the K keys of a queue, all l2-normalized:

    L(q) = -log( exp(q.k+ / t) / (exp(q.k+ / t) + sum_j exp(q.queue_j / t)) ),

symmetrized over the two views (q1 with k2, q2 with k1), as FedSSL implementations on CIFAR do.
Per-sample terms have no within-batch interaction, so a batch of N >= 1 is enough and a group of
clients' losses are segment means. A queue starts as zeros: a zero key adds exp(0) = 1 to the
denominator, what a random unit key adds in expectation (MoCo's initial queue is random unit
vectors), until it is replaced. After each step the step's keys of the second view enter the queue
and the oldest leave (`enqueue`).
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.losses import per_client
from tff_ssl.losses.pairs import check_pairs, unit
from tff_ssl.ssl.base import SSLMethod

DEFAULT_QUEUE = 4096


def info_nce_per_sample(q: tf.Tensor, k: tf.Tensor, queue: tf.Tensor,
                        temperature: float) -> tf.Tensor:
  """[N] InfoNCE of queries `q` with positive keys `k` ([N, d] each) against `queue` ([K, d])."""
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0; got {temperature}")
  q = tf.convert_to_tensor(q)
  k, queue = tf.convert_to_tensor(k, q.dtype), tf.convert_to_tensor(queue, q.dtype)
  check_pairs(q, k)
  q, k = unit(q), tf.stop_gradient(unit(k))
  positive = tf.reduce_sum(q * k, axis=1, keepdims=True)  # [N, 1]
  negatives = tf.matmul(q, tf.stop_gradient(unit(queue)), transpose_b=True)  # [N, K]
  logits = tf.concat([positive, negatives], axis=1) / temperature
  return tf.reduce_logsumexp(logits, axis=1) - logits[:, 0]


def moco_loss_per_sample(z1, z2, t1, t2, queue, temperature: float) -> tf.Tensor:
  """[N] symmetrized MoCo loss: q1 against k2 and q2 against k1, summed."""
  return (info_nce_per_sample(z1, t2, queue, temperature) +
          info_nce_per_sample(z2, t1, queue, temperature))


def moco_loss(z1, z2, t1, t2, queue, temperature: float) -> tf.Tensor:
  """The symmetrized MoCo loss, a mean over the batch."""
  return tf.reduce_mean(moco_loss_per_sample(z1, z2, t1, t2, queue, temperature))


def moco_loss_per_client(z1: tf.Tensor, z2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor,
                         queue: tf.Tensor, sizes: tf.Tensor, temperature: float) -> tf.Tensor:
  """[K] symmetrized MoCo losses (`moco_loss`) of clients whose rows have the given sizes, all
  against the same `queue` (the batched pass: every client's queue is its initial one)."""
  return per_client.mean_per_client(moco_loss_per_sample(z1, z2, t1, t2, queue, temperature),
                                    sizes)


def enqueue(queue: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
  """The queue after `keys` ([N, d], normalized here) enter at the front and the oldest N leave."""
  out = tf.concat([tf.stop_gradient(unit(keys)), queue], axis=0)[:tf.shape(queue)[0]]
  return tf.ensure_shape(out, queue.shape)  # A loop variable keeps its static shape.


METHOD = SSLMethod(
    name="moco",
    loss=lambda o, hp: moco_loss(o.z1, o.z2, o.t1, o.t2, o.queue, hp.temperature),
    per_client_loss=lambda o, sizes, hp: moco_loss_per_client(
        o.z1, o.z2, o.t1, o.t2, o.queue, sizes, hp.temperature),
    ema_target=True, queue=True, min_samples=1,
    hparams=("temperature", "target_decay", "moco_queue"),
    fields=(Field("moco_queue", DEFAULT_QUEUE, "MoCo: negative keys in the queue.", lower=1),),
    # --head_norm=batch: MoCo v2's head is Linear-ReLU-Linear, with no normalization (its BN is in
    # the encoder, shuffled across GPUs).
    batch_heads="none")
