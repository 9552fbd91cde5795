"""FLL's depth dropout as a client term: at each local step each of the ViT encoder's first
`droppable_blocks` blocks (the frozen ones) is skipped with probability `rate`, drawn from the step's
seed (`models.vit.block_keep`). Both papers use rate 0.5.

The field it reads: `depth_dropout` (the rate).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.federated.client_work import ClientTerm
from tff_ssl.models import vit

KEY = 0xDD  # Folded into a local step's seed: its blocks' keep draws.
RATE = Field("depth_dropout", 0.5, "FLL + DD: the probability that a frozen block is skipped at a "
             "local step.", lower=0, upper=1, open_upper=True)
FIELDS = (RATE,)


@dataclasses.dataclass(frozen=True)
class DepthDropout(ClientTerm):
  """Skips each of the first `droppable_blocks` blocks with probability `rate` at each step."""

  rate: float
  droppable_blocks: int
  key = "depth_dropout"

  def __post_init__(self):
    RATE.check(self.rate)
    if self.droppable_blocks < 0:
      raise ValueError(f"droppable_blocks must be >= 0; got {self.droppable_blocks}")

  def scope(self, step_seed):
    u = tf.random.stateless_uniform(
        [self.droppable_blocks], tf.random.experimental.stateless_fold_in(step_seed, KEY))
    return vit.block_keep(u >= self.rate)

  def skipped_blocks(self):
    return (False,) * self.droppable_blocks, self.rate


def terms(rate: float, droppable_blocks: int) -> tuple[ClientTerm, ...]:
  """The depth-dropout term over `droppable_blocks` blocks (none where nothing can be dropped)."""
  if not rate or not droppable_blocks:
    return ()
  return (DepthDropout(rate, droppable_blocks),)
