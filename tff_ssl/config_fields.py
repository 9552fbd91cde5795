"""Config fields that describe themselves, and the version of the config's layout.

A `Field` is one declaration of one `ExperimentConfig` field: its default, its help text, its
domain (bounds, choices). From it come the dataclass field (`dataclass_field`), its check (`check`:
the one place its rule is written; typed sub-configs that receive the value call the same check),
and its command-line flag (`tff_ssl.cli.define_config_flags`: bin/train writes no flag by hand).

Every field is declared by the module that owns it (a partition's in `data/partition.py`, the probe's
in `evaluation/protocols.py`, a loss's with the loss, ...; `tff_ssl/experiment.py` gathers the ones
every run has); a method declares the fields only it (or its family) reads in its own module, in
`Method.fields` (`tff_ssl.method`), and `ExperimentConfig` is assembled from both. Adding a method's
field is one `Field(...)` in the method's module.

hparams.json carries `config_version` (`VERSION`). A run folder written by an older layout is
upgraded on reading (`upgrade`); one written by a newer layout is refused in one line.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable

# The layout of hparams.json. 1 (no key): before 2026-11-27. 2: the one optimizer registry
# (`tff_ssl.optim.OPTIMIZERS`), where `--optimizer=sgd` is plain SGD and the former "sgd"
# (momentum 0.9) is "sgdm".
VERSION = 2
VERSION_KEY = "config_version"


def _upgrade_1(fields: dict) -> dict:
  if fields.get("optimizer") == "sgd":  # Version 1's centralized "sgd" had momentum 0.9.
    fields["optimizer"] = "sgdm"
  return fields


UPGRADES: dict[int, Callable[[dict], dict]] = {1: _upgrade_1}  # version v -> v + 1.


def upgrade(stored: dict, where: str = "hparams.json") -> dict:
  """The fields of a stored config (hparams.json's content) in today's layout, without the version
  key. ValueError (one line) for a layout newer than this code's."""
  fields = dict(stored)
  version = fields.pop(VERSION_KEY, 1)
  if not isinstance(version, int) or version < 1:
    raise ValueError(f"{where}: {VERSION_KEY} {version!r} is not a config version; the file is "
                     f"not tff-ssl's")
  if version > VERSION:
    raise ValueError(f"{where} has {VERSION_KEY} {version}, newer than this tff-ssl's {VERSION}; "
                     f"update tff-ssl (git pull) to read it")
  for v in range(version, VERSION):
    fields = UPGRADES[v](fields)
  return fields


def _number(value: float) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field.

  name, default, help: the field, its default and what it means (the flag's help text).
  kind: its type: bool, int, float, str or tuple (default: the default's type; str for None).
  item: a tuple's element type (int or str); on the command line a comma-separated list.
  choices: the allowed values, or a callable giving them (a registry, read when first needed).
  lower, upper: bounds; open_lower / open_upper exclude the bound itself.
  note: what the bounds' ends mean, e.g. "0: the whole split" (in the error and the help).
  optional: None is allowed (no value).
  """

  name: str
  default: Any
  help: str
  kind: type | None = None
  item: type = str
  choices: Iterable[Any] | Callable[[], Iterable[Any]] | None = None
  lower: float | None = None
  upper: float | None = None
  open_lower: bool = False
  open_upper: bool = False
  note: str = ""
  optional: bool = False

  @property
  def type(self) -> type:
    if self.kind is not None:
      return self.kind
    return str if self.default is None else type(self.default)

  def choice_list(self) -> list | None:
    if self.choices is None:
      return None
    values = self.choices() if callable(self.choices) else self.choices
    return list(values)

  def domain(self) -> str:
    """The bounds in words: ">= 1", "> 0", "in (0, 1]"; "" without bounds."""
    if self.lower is not None and self.upper is not None:
      return (f"in {'(' if self.open_lower else '['}{_number(self.lower)}, "
              f"{_number(self.upper)}{')' if self.open_upper else ']'}")
    if self.lower is not None:
      return f"{'>' if self.open_lower else '>='} {_number(self.lower)}"
    if self.upper is not None:
      return f"{'<' if self.open_upper else '<='} {_number(self.upper)}"
    return ""

  def describe(self) -> str:
    """The flag's help text: the help, then the domain."""
    domain = self.domain()
    if not domain:
      return self.help
    return f"{self.help} Must be {domain}{f' ({self.note})' if self.note else ''}."

  def normalize(self, value: Any) -> Any:
    """`value` in the field's type (tuples of `item`; a list from JSON becomes a tuple)."""
    if value is None or self.type is not tuple:
      return value
    try:
      return tuple(self.item(v) for v in value)
    except (TypeError, ValueError):
      raise ValueError(f"{self.name} must be a list of {self.item.__name__}s; got {value!r}") \
          from None

  def check(self, value: Any) -> None:
    """Raises ValueError, one line naming the field, the value and the allowed ones, unless `value`
    is in the field's domain."""
    if value is None:
      if self.optional:
        return
      raise ValueError(f"{self.name} needs a value (its default: {self.default!r})")
    values = value if self.type is tuple else (value,)
    for v in values:
      if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"--{self.name}={v} is not a finite number; give a finite value (its "
                         f"default: {self.default})")
      choices = self.choice_list()
      if choices is not None and v not in choices:
        raise ValueError(f"unknown {self.name} {v!r}; choose one of {sorted(choices)}")
      lower_fails = self.lower is not None and (v <= self.lower if self.open_lower
                                                else v < self.lower)
      upper_fails = self.upper is not None and (v >= self.upper if self.open_upper
                                                else v > self.upper)
      if lower_fails or upper_fails:
        note = f" ({self.note})" if self.note else ""
        raise ValueError(f"{self.name} must be {self.domain()}{note}; got {v}")

  def dataclass_field(self) -> tuple[str, Any, dataclasses.Field]:
    """(name, annotation, dataclasses.field) for `dataclasses.make_dataclass`; the metadata holds
    this `Field` (`spec_of`)."""
    annotation = self.type.__name__ + (" | None" if self.optional or self.default is None else "")
    return self.name, annotation, dataclasses.field(default=self.default, metadata={"spec": self})


def spec_of(field: dataclasses.Field) -> Field | None:
  """The `Field` a dataclass field was made from (None: a field without one)."""
  return field.metadata.get("spec")


def specs(config_class) -> list[Field]:
  """The `Field`s of a config dataclass, in its field order."""
  return [s for s in (spec_of(f) for f in dataclasses.fields(config_class)) if s is not None]


def collect(groups: Iterable[Iterable[Field]]) -> list[Field]:
  """The fields of `groups` without repeats, in order of first appearance; ValueError if two
  different declarations share a name."""
  seen: dict[str, Field] = {}
  for group in groups:
    for spec in group:
      if spec.name in seen and seen[spec.name] != spec:
        raise ValueError(f"config field {spec.name!r} is declared twice, differently; declare it "
                         f"once and share the `Field`")
      seen.setdefault(spec.name, spec)
  return list(seen.values())


def make_config_class(name: str, fields: list[Field], base: type, module: str) -> type:
  """A frozen dataclass `name` of `fields` (all with defaults) over `base`'s methods."""
  cls = dataclasses.make_dataclass(name, [f.dataclass_field() for f in fields], bases=(base,),
                                   frozen=True, namespace={"__doc__": base.__doc__})
  cls.__module__ = module
  return cls
