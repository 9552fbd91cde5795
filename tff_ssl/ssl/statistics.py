"""The statistics losses (`tff_ssl.losses.STATISTICS`) as within-client SSL methods.

A statistics loss is a function of means over images: within one client's batch it is the loss of
that batch's statistics (`StatisticsLoss.batch_loss`), and for a group of concatenated clients each
client's statistics come from its own rows in one batched pass (`StatisticsLoss.per_client_loss`).
"""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.ssl.base import SSLMethod


def method(entry: losses.statistics.StatisticsLoss) -> SSLMethod:
  """`entry` as a within-client SSL method (projections only, no predictor or target network)."""
  return SSLMethod(
      name=entry.name,
      loss=lambda o, hp: entry.batch_loss(o.z1, o.z2, hp),
      per_client_loss=lambda o, sizes, hp: entry.per_client_loss(o.z1, o.z2, sizes, hp),
      min_samples=entry.min_samples, hparams=entry.hparams,
      # --head_norm=batch: BN in the projector's hidden layers (VICReg's expander, as Barlow Twins').
      batch_heads="hidden")


def methods(exclude: tuple[str, ...] = ()) -> tuple[SSLMethod, ...]:
  """A method for every statistics loss but those in `exclude` (those with a module of their own)."""
  return tuple(method(e) for name, e in losses.STATISTICS.items() if name not in exclude)
