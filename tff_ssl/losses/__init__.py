"""Self-supervised losses as pure functions of tensors (the SSL methods of `tff_ssl.ssl` use them)."""

from __future__ import annotations

from tff_ssl.losses.cco import (EncodingStatistics, cco_loss, cco_loss_from_statistics,
                                cross_correlation, encoding_statistics, weighted_mean_statistics)
from tff_ssl.losses import (byol, cco, feature_correlation, moco, mocov3, ntxent, simsiam, spectral,
                            statistics, vicreg)
from tff_ssl.losses.byol import byol_loss
from tff_ssl.losses.moco import moco_loss
from tff_ssl.losses.mocov3 import alignment_loss, mocov3_loss
from tff_ssl.losses.ntxent import nt_xent_loss
from tff_ssl.losses.simsiam import simsiam_loss

# The statistics losses (`statistics.py`): losses of means over images, which DCCO trains exactly
# across clients of any size; each also a within-client loss (`tff_ssl.ssl`).
STATISTICS: dict[str, statistics.StatisticsLoss] = {e.name: e for e in (
    cco.STATISTICS, vicreg.STATISTICS, spectral.STATISTICS)}


def get_statistics(name: str) -> statistics.StatisticsLoss:
  if name not in STATISTICS:
    raise ValueError(f"unknown statistics loss {name!r}; choose one of {sorted(STATISTICS)}")
  return STATISTICS[name]
