"""Client add-ons: client terms that any FedAvg-style method's clients take by a flag, whatever the
method (FedX's distillation, `--fedx`; FedU²'s uniformity regularizer, `--fedu2_fur`). An add-on is
one module with its `Field`s and `terms(config)`, and its line in `ADDONS` below;
`fedavg.process_config` (which every FedAvg-style method builds its clients' config with) adds the
terms of the add-ons a config turns on, and `fedavg.FIELDS` carries their fields, so every method
that reads FedAvg's fields takes them (and a method that does not, DCCO, refuses them by name). An
add-on whose terms read the predictor's outputs gives the model a predictor head where its SSL
method has none (`predictor`).

(FedFoA is not one yet: it needs clients with a state and a check of the batch size.)"""

from __future__ import annotations

import types

from tff_ssl.config_fields import Field
from tff_ssl.methods import fedu2, fedx

ADDONS: tuple[types.ModuleType, ...] = (fedx, fedu2)

FIELDS: tuple[Field, ...] = tuple(f for a in ADDONS for f in a.FIELDS)
# The flags that turn on an add-on's server stage: a method that cannot add stages to its process
# (FedLAMA's own per-layer aggregation, the layer-wise methods' per-stage processes) leaves them out of
# its fields, so it refuses them by name.
SERVER_FIELDS: tuple[Field, ...] = tuple(f for a in ADDONS for f in getattr(a, "SERVER_FIELDS", ()))


def validate(config) -> None:
  """Each add-on's rules between its flags and the method's (`validate(config)` where it has one)."""
  for a in ADDONS:
    if hasattr(a, "validate"):
      a.validate(config)


def terms(config) -> tuple:
  """The client terms of the add-ons `config` turns on, in `ADDONS` order."""
  return tuple(t for a in ADDONS for t in a.terms(config))


def stages(config, model, mask) -> tuple:
  """The server stages (`server_stage.ServerStage`) of the add-ons `config` turns on (FedU²'s EUA):
  each FedAvg-style process adds them after its own."""
  return tuple(st for a in ADDONS if hasattr(a, "stages") for st in a.stages(config, model, mask))


def predictor(config) -> bool:
  """Whether a term of `config`'s add-ons reads the predictor's outputs."""
  return any(t.predictions for t in terms(config))
