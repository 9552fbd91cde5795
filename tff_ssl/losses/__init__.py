"""Self-supervised losses as pure functions of tensors: the statistics losses (each a module with its
terms, loss, fields and within-client forms; DCCO trains them across clients, `tff_ssl.ssl` derives
their within-client methods), the add-ons' loss terms (feature correlation, relational, uniformity)
and what losses share (`pairs`, `per_client`). A within-client-only loss lives with its SSL method
(`tff_ssl.ssl.<name>`)."""

from __future__ import annotations

from tff_ssl.losses.cco import (EncodingStatistics, cco_loss, cco_loss_from_statistics,
                                cross_correlation, encoding_statistics, weighted_mean_statistics)
from tff_ssl.losses import cco, feature_correlation, spectral, statistics, vicreg

# The statistics losses (`statistics.py`): losses of means over images, which DCCO trains exactly
# across clients of any size; each also a within-client loss (`tff_ssl.ssl`).
STATISTICS: dict[str, statistics.StatisticsLoss] = {e.name: e for e in (
    cco.STATISTICS, vicreg.STATISTICS, spectral.STATISTICS)}


def get_statistics(name: str) -> statistics.StatisticsLoss:
  if name not in STATISTICS:
    raise ValueError(f"unknown statistics loss {name!r}; choose one of {sorted(STATISTICS)}")
  return STATISTICS[name]
