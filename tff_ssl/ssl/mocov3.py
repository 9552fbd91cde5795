"""MoCo v3 (Chen, Xie and He, 2021), LW-FedSSL's client SSL method: an online encoder + projector +
predictor and a momentum (target) encoder + projector, the EMA of the online ones over local steps
(`target_decay`, 0.99 in LW-FedSSL); the loss contrasts each view's prediction with the momentum
projections of the other view of every image in the batch (below; temperature 0.2
in LW-FedSSL: `--temperature=0.2`). No queue. The paper's heads are a 3-layer projector and a 2-layer
predictor, hidden 4096, output 256 (`--projector=4096,4096,256 --predictor=4096,256`); MoCo v3's heads
have BatchNorm (`--head_norm=batch`), the default heads here GroupNorm (batch-free).

`vit_recipe(federated)`: MoCo v3's training of ViTs (its Section 4 and public configs), as the fields
that set it: AdamW with decoupled weight decay 0.1, a linear warm-up then cosine decay over the whole
run (40 of 300 epochs in the paper; here a tenth of the steps or rounds), batch-statistics heads.
MoCo v3's freezing of the patch projection at its random initialization is an option beside it
(`--freeze_patch_embed`), off in the recipe: LW-FedSSL trains the patch projection ("we follow MoCo
v3, except that we train the patch projection layer"). Federated, the clients' optimizer follows it
(`client_lr_schedule=warmup_cosine`: the rate is a function of the round and the local step, across
rounds, stages and resumes). The ViT tables and gate start from it; a flag's default never changes
with another flag, so `--encoder=vit_mini` alone does not turn it on.

The loss: a query q (the online network's prediction of one view) is contrasted with the momentum
network's projections k of the other view of every image in the batch, all l2-normalized; its own
image's key is the positive:

    ctr(q, k) = 2 t * mean_i CE(softmax_j(q_i . k_j / t), i),    loss = ctr(q1, k2) + ctr(q2, k1).

The 2 t factor is MoCo v3's (it makes the gradient's scale independent of t). Keys are
stop-gradiented. Each anchor's negatives are the batch's other keys, so a client needs at least 2
images.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tff_ssl.losses import per_client
from tff_ssl.losses.pairs import check_pairs, unit
from tff_ssl.ssl.base import SSLMethod

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


def mocov3_loss_per_client(p1: tf.Tensor, p2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor,
                           sizes: tf.Tensor, temperature: float) -> tf.Tensor:
  """[K] MoCo v3 losses (`mocov3_loss`): each client's queries see only that client's keys."""
  q1, mask = per_client.pad_by_client(tf.convert_to_tensor(p1), sizes)
  q2, _ = per_client.pad_by_client(tf.convert_to_tensor(p2, q1.dtype), sizes)
  k1, _ = per_client.pad_by_client(tf.convert_to_tensor(t1, q1.dtype), sizes)
  k2, _ = per_client.pad_by_client(tf.convert_to_tensor(t2, q1.dtype), sizes)
  m = tf.shape(mask)[1]
  labels = tf.broadcast_to(tf.range(m)[None], tf.shape(mask))

  def ctr(q, k):
    logits = tf.matmul(unit(q), tf.stop_gradient(unit(k)), transpose_b=True) / temperature
    logits -= (1.0 - mask[:, None, :]) * 1e9  # Padding is nobody's negative.
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return 2.0 * temperature * tf.reduce_sum(ce * mask, axis=1) / tf.reduce_sum(mask, axis=1)

  return ctr(q1, k2) + ctr(q2, k1)

METHOD = SSLMethod(
    name="mocov3",
    loss=lambda o, hp: mocov3_loss(o.p1, o.p2, o.t1, o.t2, hp.temperature),
    per_client_loss=lambda o, sizes, hp: mocov3_loss_per_client(
        o.p1, o.p2, o.t1, o.t2, sizes, hp.temperature),
    predictor=True, ema_target=True, min_samples=2,
    hparams=("temperature", "target_decay", "predictor"),
    # --head_norm=batch: MoCo v3: BN on every projector layer, the output's non-affine; BN on the
    # predictor's hidden layer.
    batch_heads="hidden+output")


VIT_WEIGHT_DECAY = 0.1  # MoCo v3's ViTs (AdamW).
VIT_WARMUP_FRACTION = 0.1  # Of the run (the paper: 40 of 300 epochs on ImageNet).


def vit_recipe(federated: bool) -> dict[str, Any]:
  """The config fields of MoCo v3's ViT recipe (module docstring), for centralized pretraining or
  (`federated`) for FedAvg-style clients; the learning rate and the run's length are the caller's."""
  shared = {"ssl": "mocov3", "head_norm": "batch", "warmup_fraction": VIT_WARMUP_FRACTION}
  if federated:
    return {**shared, "client_optimizer": "adamw", "client_weight_decay": VIT_WEIGHT_DECAY,
            "client_lr_schedule": "warmup_cosine"}
  return {**shared, "optimizer": "adamw", "weight_decay": VIT_WEIGHT_DECAY}
