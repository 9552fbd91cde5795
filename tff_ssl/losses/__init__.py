"""Self-supervised losses, and the registry of within-batch losses by name."""

from __future__ import annotations

import functools
from typing import Callable

from tff_ssl.losses.cco import (EncodingStatistics, cco_loss, cco_loss_from_statistics,
                                cross_correlation, encoding_statistics, weighted_mean_statistics)
from tff_ssl.losses import cco, ntxent
from tff_ssl.losses.ntxent import nt_xent_loss

# A within-batch loss maps two views' projections ([N, d] each) to a scalar.
LOSSES: dict[str, Callable[..., Callable]] = {
    "cco": lambda lambd=cco.DEFAULT_LAMBDA: functools.partial(cco_loss, lambd=lambd),
    "nt_xent": lambda temperature=ntxent.DEFAULT_TEMPERATURE: functools.partial(
        nt_xent_loss, temperature=temperature),
}


def get_loss(name: str, **kwargs) -> Callable:
  """The within-batch loss `name` with its hyperparameters bound (`lambd` for cco, `temperature`
  for nt_xent)."""
  if name not in LOSSES:
    raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
  return LOSSES[name](**kwargs)
