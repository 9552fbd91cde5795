"""The statistics losses (`tff_ssl.losses.STATISTICS`) as within-client SSL methods.

A statistics loss is a function of means over images: within one client's batch it is the loss of
that batch's statistics (`StatisticsLoss.batch_loss`), and for a group of concatenated clients each
client's statistics come from its own rows in one batched pass (`StatisticsLoss.per_client_loss`). A
loss with within-client forms of its own (CCO: the correlation matrix, the Gram form) gives them as
`batch_form` / `per_client_form`, which its method uses instead.
"""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.ssl.base import SSLMethod


def method(entry: losses.statistics.StatisticsLoss) -> SSLMethod:
  """`entry` as a within-client SSL method (projections only, no predictor or target network), with
  its own within-client forms where it has them (CCO's)."""
  batch = entry.batch_form or entry.batch_loss
  per_client = entry.per_client_form or entry.per_client_loss
  return SSLMethod(
      name=entry.name,
      loss=lambda o, hp: batch(o.z1, o.z2, hp),
      per_client_loss=lambda o, sizes, hp: per_client(o.z1, o.z2, sizes, hp),
      min_samples=entry.min_samples, hparams=entry.hparams, fields=entry.fields,
      # --head_norm=batch: BN in the projector's hidden layers (VICReg's expander, as Barlow Twins').
      batch_heads="hidden")


def methods() -> tuple[SSLMethod, ...]:
  """A within-client method for every statistics loss."""
  return tuple(method(e) for e in losses.STATISTICS.values())
