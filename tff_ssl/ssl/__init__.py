"""Client SSL methods for FedAvg-style training, and their registry by name.

  simclr        NT-Xent within the client's batch                        (simclr.py)
  barlow_twins  the CCO / Barlow Twins cross-correlation loss            (barlow_twins.py)
  byol          predictor + EMA target network within local training     (byol.py)
  simsiam       predictor + stop-gradient, no target network             (simsiam.py)
"""

from __future__ import annotations

from tff_ssl.ssl import barlow_twins, byol, simclr, simsiam
from tff_ssl.ssl.base import Outputs, SSLMethod

SSL_METHODS: dict[str, SSLMethod] = {m.name: m for m in (
    simclr.METHOD, barlow_twins.METHOD, byol.METHOD, simsiam.METHOD)}


def get(name: str) -> SSLMethod:
  if name not in SSL_METHODS:
    raise ValueError(f"unknown SSL method {name!r}; choose one of {sorted(SSL_METHODS)}")
  return SSL_METHODS[name]
