"""Self-supervised losses, and the registry of within-batch losses by name."""

from __future__ import annotations

import functools
from typing import Callable

from tff_ssl.losses.cco import (EncodingStatistics, cco_loss, cco_loss_from_statistics,
                                cross_correlation, encoding_statistics, weighted_mean_statistics)
from tff_ssl.losses import byol, cco, ntxent, simsiam
from tff_ssl.losses.byol import byol_loss
from tff_ssl.losses.ntxent import nt_xent_loss
from tff_ssl.losses.simsiam import simsiam_loss

# A within-batch loss maps two views' projections ([N, d] each) to a scalar.
LOSSES: dict[str, Callable[..., Callable]] = {
    "cco": lambda lambd=cco.DEFAULT_LAMBDA: functools.partial(cco_loss, lambd=lambd),
    "nt_xent": lambda temperature=ntxent.DEFAULT_TEMPERATURE: functools.partial(
        nt_xent_loss, temperature=temperature),
}

# A prediction loss maps the online predictions p1, p2 and target projections t1, t2 to a scalar.
PREDICTION_LOSSES: dict[str, Callable] = {"byol": byol_loss, "simsiam": simsiam_loss}


def get_loss(name: str, **kwargs) -> Callable:
  """The within-batch loss `name` with its hyperparameters bound (`lambd` for cco, `temperature`
  for nt_xent)."""
  if name not in LOSSES:
    raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
  return LOSSES[name](**kwargs)
