"""The methods built on the round anatomy (`tff_ssl.federated`), one module each, and their registry
(`--method`): every method the project runs, by name. The list with each method's SSL losses and
flags is docs/running.md, "Methods" (checked against `METHODS` by tests/test_adding_a_method.py);
each entry's `summary` is its line in `bin/train --helpfull`.

Each entry is a `tff_ssl.method.Method`; callers ask the entry (`get(name).federated`,
`.min_samples(config)`, `.build(...)`), never compare names. Client terms other methods add:
`alignment.py` (LW-FedSSL's representation alignment), `depth_dropout.py` (FLL's), `fedfoa.py`
(FedFoA's feature-correlation term, on FedBYOL / FedU / FedEMA and heterogeneous clients).
"""

from __future__ import annotations

from tff_ssl.methods import (dcco, fedavg, fedbyol, fedema, fedlama, fedmoco, fedmoco_lw, fedprox,
                             fedu, fll_dd, heterogeneous, lw_fedssl, prog_fedssl)
from tff_ssl.method import SUPERVISED_FIELDS, Method
from tff_ssl.training import centralized

SUPERVISED = Method(
    name="supervised", kind="supervised", fields=SUPERVISED_FIELDS,
    no_batch_heads="the supervised baseline has no SSL heads",
    summary="Supervised training from scratch on the labeled fraction: the tables' lower baseline.")

METHODS: dict[str, Method] = {m.name: m for m in (
    dcco.METHOD,
    fedavg.METHOD,
    fedbyol.METHOD,
    fedu.METHOD,
    fedmoco.METHOD,
    fedema.METHOD,
    fedlama.METHOD,
    fedprox.METHOD,
    fedmoco_lw.METHOD,
    prog_fedssl.METHOD,
    lw_fedssl.METHOD,
    fll_dd.METHOD,
    heterogeneous.METHOD,
    centralized.METHOD,
    SUPERVISED,
)}


def get(name: str) -> Method:
  """The method `name`; ValueError listing the registered names otherwise."""
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
  return METHODS[name]


# The fields of the assembled `ExperimentConfig`; None until `tff_ssl.experiment` assembles it from
# the registry (`config_assembled`): a method registered before then brings its fields into it.
_CONFIG_FIELDS: set[str] | None = None


def config_assembled(field_names) -> None:
  """Called by `tff_ssl.experiment` once it has assembled the config from the registry."""
  global _CONFIG_FIELDS
  _CONFIG_FIELDS = set(field_names)


def register(method: Method) -> None:
  """Adds `method` to the registry (a method defined outside the package, e.g. in a test). Once
  `tff_ssl.experiment` has assembled the config, it may read any config field but declare no new
  one."""
  if method.name in METHODS:
    raise ValueError(f"a method named {method.name!r} is already registered")
  new = [f.name for f in method.declared
         if _CONFIG_FIELDS is not None and f.name not in _CONFIG_FIELDS]
  if new:
    raise ValueError(f"method {method.name!r} declares config fields {new} that ExperimentConfig "
                     f"(assembled when tff_ssl.experiment was imported) lacks; add its line to METHODS in "
                     f"tff_ssl/methods/__init__.py instead of registering it at run time")
  METHODS[method.name] = method
