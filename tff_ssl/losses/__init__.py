"""Self-supervised losses as pure functions of tensors (the SSL methods of `tff_ssl.ssl` use them)."""

from __future__ import annotations

from tff_ssl.losses.cco import (EncodingStatistics, cco_loss, cco_loss_from_statistics,
                                cross_correlation, encoding_statistics, weighted_mean_statistics)
from tff_ssl.losses import byol, cco, feature_correlation, moco, mocov3, ntxent, simsiam
from tff_ssl.losses.byol import byol_loss
from tff_ssl.losses.moco import moco_loss
from tff_ssl.losses.mocov3 import alignment_loss, mocov3_loss
from tff_ssl.losses.ntxent import nt_xent_loss
from tff_ssl.losses.simsiam import simsiam_loss
