"""FedEMA (Zhuang et al., ICLR 2022): a client's online encoder and predictor start each round as
mu W_k + (1 - mu) W_g, mu = min(lambda_k ||W_g - W_k||, 1), lambda_k constant (`fedema_lambda`, the
paper's 0.8) or, by default, the autoscaler tau / ||W_g - W_k|| fixed where first known
(`fedema_tau`, the paper's 0.7; the public code's 0.8). `tff_ssl.methods.fedssl` has the details
and the public code's divergence (`--divergence_measure=code`)."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.methods import fedssl

FEDEMA_LAMBDA = Field("fedema_lambda", 0.0, "FedEMA: constant scaler lambda (the paper's 0.8); "
                      "0: the autoscaler with --fedema_tau.", lower=0, note="0: the autoscaler")
FEDEMA_TAU = Field("fedema_tau", 0.7, "FedEMA autoscaler: the expected mu (paper 0.7, public code "
                   "0.8).", lower=0, upper=1, open_lower=True)


@dataclasses.dataclass(frozen=True)
class Update(fedssl.OnlineUpdate):
  """FedEMA's rule: the online network (encoder and predictor) starts as mu W_k + (1 - mu) W_g,
  mu = min(lambda_k d, 1); lambda_k = `ema_lambda` (> 0), else the autoscaler tau / d, set once."""

  ema_lambda: float = 0.0
  ema_tau: float = 0.7
  keeps_online = True

  def __post_init__(self):
    FEDEMA_LAMBDA.check(self.ema_lambda)
    FEDEMA_TAU.check(self.ema_tau)

  def start(self, client, state, own, glob, returning, d):
    del client
    scale = tf.constant(self.ema_lambda) if self.ema_lambda else self._autoscale(state, d)
    mu = tf.where(returning, tf.minimum(scale * d, 1.0), 0.0)
    start = [mu * w + (1.0 - mu) * g for w, g in zip(own, glob)]
    return start, mu, d, tf.where(returning, scale, state["scale"])

  def scale_after(self, state, d, scale):
    return scale if self.ema_lambda else self._autoscale(state, d)

  def _autoscale(self, state, d):
    """lambda_k: the stored one, else tau / d (set once, the first time d is known and positive)."""
    return tf.where(tf.greater(state["scale"], 0.0), state["scale"],
                    tf.where(tf.greater(d, 0.0), self.ema_tau / tf.maximum(d, 1e-30), 0.0))


METHOD = fedssl.method(
    "fedema", lambda config: fedssl.StatefulConfig(
        online_update=Update(ema_lambda=config.fedema_lambda, ema_tau=config.fedema_tau),
        divergence=config.divergence_measure),
    "FedEMA: divergence-aware EMA of the global and the client's own online network.",
    fields=(FEDEMA_LAMBDA, FEDEMA_TAU, fedssl.DIVERGENCE_MEASURE))
