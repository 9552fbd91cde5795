"""Client SSL methods (`--ssl`), the one registry of SSL losses: used by FedAvg-style clients, DCCO
(cco) and centralized pretraining.

  cco           CCO, the Barlow Twins cross-correlation loss             (tff_ssl/losses/cco.py)
  simclr        NT-Xent within the client's batch                        (simclr.py)
  byol          predictor + EMA target network within local training     (byol.py)
  simsiam       predictor + stop-gradient, no target network             (simsiam.py)
  moco          momentum target network + a queue of negative keys       (moco.py)
  mocov3        predictor + momentum target network, in-batch negatives  (mocov3.py)
  vicreg        VICReg within the client's batch                         (tff_ssl/losses/vicreg.py)
  spectral      the spectral contrastive loss within the client's batch  (tff_ssl/losses/spectral.py)

A loss lives in one module: its function, its per-client form (optional: `SSLMethod.losses_per_client`
loops over clients without one), the hyperparameters it introduces (`fields`) and its `SSLMethod`.
Every statistics loss (`tff_ssl.losses.STATISTICS`) is also a within-client method here, derived from
its entry (`statistics.py`); DCCO trains the statistics losses across clients.

Their hyperparameters (`HPARAMS`) are assembled from the registry; the configs that train with them
carry an `Hparams` (`hparams_of(config)`), which the losses read by name.
"""

from __future__ import annotations

import dataclasses

from tff_ssl.config_fields import Field
from tff_ssl.ssl import byol, moco, mocov3, simclr, simsiam, statistics
from tff_ssl.ssl.base import Outputs, SSLMethod

_STATISTICS = {m.name: m for m in statistics.methods()}
# CCO first (DCCO's), the within-client losses, then the other statistics losses.
SSL_METHODS: dict[str, SSLMethod] = {m.name: m for m in (
    _STATISTICS.pop("cco"), simclr.METHOD, byol.METHOD, simsiam.METHOD, moco.METHOD, mocov3.METHOD,
    *_STATISTICS.values())}


def _hparams(methods) -> dict[str, Field]:
  """The hyperparameters the methods declare, by name; one declared twice must be the same Field."""
  out: dict[str, Field] = {}
  for m in methods:
    for f in m.fields:
      if out.setdefault(f.name, f) != f:
        raise ValueError(f"SSL hyperparameter {f.name!r} is declared twice, differently (by "
                         f"{m.name!r} and an earlier method); declare it once and name it in "
                         "`hparams` elsewhere")
  return out


# The SSL methods' hyperparameters (`SSLMethod.hparams` names the ones each reads): declared by the
# methods, checked here, for centralized pretraining and for federated clients alike.
HPARAMS: dict[str, Field] = _hparams(SSL_METHODS.values())

# The SSL hyperparameters as one value (a frozen dataclass with a field per HPARAMS entry, its
# default the entry's): what a training config carries and a loss reads (`hparams.cco_lambda`).
Hparams = dataclasses.make_dataclass(
    "Hparams", [(f.name, type(f.default), dataclasses.field(default=f.default))
                for f in HPARAMS.values()], frozen=True,
    namespace={"__post_init__": lambda self: check_hparams(self),
               "__module__": __name__})


def hparams_of(config) -> "Hparams":
  """The SSL hyperparameters of `config` (an `ExperimentConfig`: the flags of the same names)."""
  return Hparams(**{name: getattr(config, name) for name in HPARAMS})


def check_hparams(config) -> None:
  """Checks `config`'s SSL hyperparameters (any object with the HPARAMS fields)."""
  for name, spec in HPARAMS.items():
    spec.check(getattr(config, name))


def get(name: str) -> SSLMethod:
  if name not in SSL_METHODS:
    raise ValueError(f"unknown SSL method {name!r}; choose one of {sorted(SSL_METHODS)}")
  return SSL_METHODS[name]
