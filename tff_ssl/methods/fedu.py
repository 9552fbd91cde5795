"""FedU (Zhuang et al., ICCV 2021): FedBYOL whose clients take the global predictor only when their
online encoder has diverged from the global one by less than `fedu_threshold` (0.4, the public
code's); otherwise they keep their own predictor (`tff_ssl.methods.fedssl`). With SimCLR or
Barlow Twins (`--ssl=simclr|cco`: L-DAWA's Table 2 rows FedU and L-DAWA_FedU, the latter with
`--aggregator=ldawa_fedavg`) the projector is the head kept or taken."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.methods import fedssl

FEDU_THRESHOLD = Field("fedu_threshold", 0.4, "FedU: take the global predictor only when the "
                       "online encoder's divergence is below this (the public code's 0.4).",
                       lower=0, open_lower=True)


@dataclasses.dataclass(frozen=True)
class Update(fedssl.OnlineUpdate):
  """FedU's divergence-aware predictor update: the online encoder from the global one; the head
  (predictor, else projector) the client's own while its divergence is >= `threshold`."""

  threshold: float = 0.4
  keeps_online = True

  def __post_init__(self):
    FEDU_THRESHOLD.check(self.threshold)

  def check(self, client):
    if not (client.head and client.encoder):
      raise ValueError("FedU's divergence-aware update needs a model with a predictor or projector "
                       "head on an encoder")

  def start(self, client, state, own, glob, returning, d):
    keep = tf.logical_and(returning, tf.greater_equal(d, self.threshold))
    start = [tf.where(keep, own[i], glob[i]) if i in client.head else glob[i]
             for i in range(len(glob))]
    return start, tf.cast(keep, tf.float32), d, state["scale"]


METHOD = fedssl.method(
    "fedu", lambda config: fedssl.StatefulConfig(online_update=Update(config.fedu_threshold),
                                                 divergence=config.divergence_measure),
    "FedU: FedBYOL with the divergence-aware predictor update.",
    fields=(FEDU_THRESHOLD, fedssl.DIVERGENCE_MEASURE), ssl=("byol", "simclr", "cco"))
