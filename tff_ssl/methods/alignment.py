"""LW-FedSSL's representation alignment (Ye et al., Sec. 3.3) as a client term: the client's loss
adds beta * InfoNCE between its local encoder's features of view 1 and the features that the model
it started from (the broadcast, global one) gives view 2, held fixed (`tff_ssl.ssl.mocov3.alignment_loss`).

The model must output its encoder's features last (`ssl_model.ssl_model_builder(..., features=True)`).
The field it reads: `alignment_weight` (beta; the paper's 0.01).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tff_ssl.ssl import mocov3
from tff_ssl.config_fields import Field
from tff_ssl.federated.client_work import ClientTerm

WEIGHT = Field("alignment_weight", 0.01, "LW-FedSSL: the weight beta of the clients' "
               "representation alignment.", lower=0, note="0: no representation alignment")
FIELDS = (WEIGHT,)


@dataclasses.dataclass(frozen=True)
class RepresentationAlignment(ClientTerm):
  """beta * InfoNCE(local features of view 1, stop-gradient(global features of view 2)) at
  `temperature` (the SSL method's)."""

  weight: float
  temperature: float
  key = "alignment"
  features = True

  def loss(self, step, carried):
    del carried
    global_features = step.model(list(step.start), step.v2, training=True)[-1]
    return self.weight * mocov3.alignment_loss(
        step.outputs.h1, tf.stop_gradient(global_features), self.temperature), None


def terms(config) -> tuple[ClientTerm, ...]:
  """The alignment term of `config` (none at alignment_weight 0)."""
  if not config.alignment_weight:
    return ()
  return (RepresentationAlignment(config.alignment_weight, config.temperature),)
