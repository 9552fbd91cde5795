"""Client SSL methods (`--ssl`), the one registry of SSL losses: used by FedAvg-style clients, DCCO
(cco) and centralized pretraining.

  cco           CCO, the Barlow Twins cross-correlation loss             (cco.py)
  simclr        NT-Xent within the client's batch                        (simclr.py)
  byol          predictor + EMA target network within local training     (byol.py)
  simsiam       predictor + stop-gradient, no target network             (simsiam.py)
  moco          momentum target network + a queue of negative keys       (moco.py)
  mocov3        predictor + momentum target network, in-batch negatives  (mocov3.py)
  vicreg        VICReg within the client's batch                         (statistics.py)
  spectral      the spectral contrastive loss within the client's batch  (statistics.py)

Every statistics loss (`tff_ssl.losses.STATISTICS`) is also a within-client method here: cco keeps its
own module (its per-client Gram form), the others are derived from their entry (`statistics.py`).
DCCO trains the statistics losses across clients.

Their hyperparameters are declared once, in `HPARAMS`; the configs that train with them carry an
`Hparams` (`hparams_of(config)`), which the losses read by name.
"""

from __future__ import annotations

import dataclasses

from tff_ssl import losses
from tff_ssl.config_fields import Field
from tff_ssl.ssl import byol, cco, moco, mocov3, simclr, simsiam, statistics
from tff_ssl.ssl.base import Outputs, SSLMethod

SSL_METHODS: dict[str, SSLMethod] = {m.name: m for m in (
    cco.METHOD, simclr.METHOD, byol.METHOD, simsiam.METHOD, moco.METHOD, mocov3.METHOD,
    *statistics.methods(exclude=(cco.METHOD.name,)))}


DEFAULT_TARGET_DECAY = 0.99  # BYOL's target EMA within local training (FedEMA's setting).

# The SSL methods' hyperparameters (`SSLMethod.hparams` names the ones each reads): declared and
# checked here, for centralized pretraining and for federated clients alike.
HPARAMS: dict[str, Field] = {f.name: f for f in (
    Field("cco_lambda", losses.cco.DEFAULT_LAMBDA, "CCO off-diagonal weight (CCO methods only).",
          lower=0),
    Field("temperature", losses.ntxent.DEFAULT_TEMPERATURE, "Temperature of the contrastive "
          "losses (SimCLR's NT-Xent, MoCo, MoCo v3).", lower=0, open_lower=True),
    Field("target_decay", DEFAULT_TARGET_DECAY, "BYOL, MoCo: EMA decay of the target network over "
          "local steps.", lower=0, upper=1, open_upper=True),
    Field("moco_queue", losses.moco.DEFAULT_QUEUE, "MoCo: negative keys in the queue.", lower=1),
    Field("vicreg_invariance", losses.vicreg.DEFAULT_INVARIANCE, "VICReg: the invariance "
          "term's weight (lambda).", lower=0),
    Field("vicreg_variance", losses.vicreg.DEFAULT_VARIANCE, "VICReg: the variance term's "
          "weight (mu).", lower=0),
    Field("vicreg_covariance", losses.vicreg.DEFAULT_COVARIANCE, "VICReg: the covariance term's "
          "weight (nu).", lower=0),
)}

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
