"""Add-ons: client terms and server stages that any FedAvg-style method takes by a flag, whatever the
method (FedFoA's feature-correlation bank, `--fedfoa`; FedX's distillation, `--fedx`; FedU²'s
uniformity regularizer and min-norm aggregation, `--fedu2_fur`, `--fedu2_eua`). An add-on is one
module and its line in `ADDONS` below. The module declares its `FIELDS`, and where it has them
`validate(config)`, `terms(config)` (client terms), `stages(config)` (a maker of its server stages from (model, mask),
its settings parsed when the config is made; `server_stage.ServerStage`s) and
`min_samples(config, base)`. What a host must offer is declared by field: `SERVER_FIELDS` replace
the round's aggregation (FedU²'s EUA), `CLIENT_STATE_FIELDS` wrap the clients' state (FedFoA); a host
that cannot offer it leaves those fields out and so refuses them by name.

`fedavg.process_config` (which every FedAvg-style method builds its clients' config with) validates
the add-ons and adds the terms of those a config turns on, `fedavg.FIELDS` carries their fields, and
each FedAvg-style build adds `stages` after its own; DCCO reads none and refuses them all. An add-on
whose terms read the predictor's outputs gives the model a predictor head where its SSL method has
none (`predictor`)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable

from tff_ssl.config_fields import Field
from tff_ssl.methods import fedfoa, fedu2, fedx

# In order: their stages run in this order, after the host's own (FedLAMA's).
ADDONS: tuple[types.ModuleType, ...] = (fedfoa, fedx, fedu2)

FIELDS: tuple[Field, ...] = tuple(f for a in ADDONS for f in a.FIELDS)
# The flags that turn on an add-on's server stage: a method that cannot add stages to its process
# (FedLAMA's own per-layer aggregation, the layer-wise methods' per-stage processes) leaves them out of
# its fields, so it refuses them by name.
SERVER_FIELDS: tuple[Field, ...] = tuple(f for a in ADDONS for f in getattr(a, "SERVER_FIELDS", ()))
# The flags of add-ons whose stage wraps the clients' state: a host whose clients keep none (FedAvg,
# FedProx, the layer-wise methods) leaves them out.
CLIENT_STATE_FIELDS: tuple[Field, ...] = tuple(
    f for a in ADDONS for f in getattr(a, "CLIENT_STATE_FIELDS", ()))


def validate(config) -> None:
  """Each add-on's rules between its flags and the method's (`validate(config)` where it has one)."""
  for a in ADDONS:
    if hasattr(a, "validate"):
      a.validate(config)


def terms(config) -> tuple:
  """The client terms of the add-ons `config` turns on, in `ADDONS` order."""
  return tuple(t for a in ADDONS if hasattr(a, "terms") for t in a.terms(config))


@dataclasses.dataclass(frozen=True)
class Stages:
  """The server stages of a config's add-ons, parsed when the config was made (`stages(config)`):
  `of(model, mask)` makes them for a host's model and trained tensors."""

  makers: tuple[Callable[[Any, Any], tuple], ...] = ()

  def of(self, model, mask) -> tuple:
    return tuple(st for make in self.makers for st in make(model, mask))


def stages(config) -> Stages:
  """The server stages (`server_stage.ServerStage`) of the add-ons `config` turns on (FedFoA's
  bank, FedU²'s EUA), each add-on's settings parsed now (`stages(config)` of its module gives a
  maker of (model, mask)); each FedAvg-style process adds them after its own."""
  return Stages(tuple(a.stages(config) for a in ADDONS if hasattr(a, "stages")))


def min_samples(config, base: int) -> int:
  """The fewest images a client needs with `config`'s add-ons, given the host's `base`."""
  for a in ADDONS:
    if hasattr(a, "min_samples"):
      base = a.min_samples(config, base)
  return base


def predictor(config) -> bool:
  """Whether a term of `config`'s add-ons reads the predictor's outputs."""
  return any(t.predictions for t in terms(config))
