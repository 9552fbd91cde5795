"""What a method is to the rest of the project: one registry entry (`tff_ssl.methods.METHODS`).

A method declares its name, its kind, the config fields it reads (declaring, as `Field`s, the ones
only it or its family reads: `ExperimentConfig` is assembled from them, and bin/train's flags made),
the client SSL losses it trains with (`tff_ssl.ssl`), the fewest images a client needs, and, for a
federated method, how its TFF process is built. The runner, `bin/train`, `tasks/` and the tables ask the entry; none compares method
names. Adding a federated method is one module (its process and its `METHOD = Method(...)`), one line
in `tff_ssl/methods/__init__.py` and its tests (docs/adding_a_method.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tff_ssl import privacy
from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field

KINDS = ("federated", "centralized", "supervised")
# Fields every federated method reads.
FEDERATED_FIELDS = ("rounds", "num_clients", "partition", "samples_per_client", "split_samples",
                    "alpha", "clients_per_round", "local_steps", "client_optimizer",
                    "client_learning_rate", "server_optimizer", "server_learning_rate",
                    "server_lr_schedule", "checkpoint_every", "simulation", "group_size",
                    "knn_every", "measure_weight_norms", "client_sampling")
# Fields of the supervised baseline and of centralized pretraining.
SUPERVISED_FIELDS = ("steps", "batch_size", "optimizer", "learning_rate")
CENTRALIZED_FIELDS = SUPERVISED_FIELDS + ("weight_decay", "warmup_fraction")


def _no_check(config) -> None:
  del config


@dataclasses.dataclass(frozen=True)
class Method:
  """A method's registry entry.

  name: what `--method` takes.
  kind: "federated" (a TFF process, run by `tff_ssl.runner`), "centralized" (pretraining
    on the pooled data) or "supervised" (the from-scratch baseline; no pretraining).
  fields: the `ExperimentConfig` fields it reads beyond the common ones: names of fields declared
    elsewhere (by the module that owns them, gathered in `tff_ssl/experiment.py`, or another method's), and `config_fields.Field`s it declares
    itself (its own fields: their default, help, bounds and choices; the config and bin/train's
    flags are made from them, and their bounds and choices checked when a config is made). The
    chosen SSL method's hyperparameters (`tff_ssl.ssl`) are read too. Setting a field the method
    does not read is an error.
  ssl: the client SSL methods it trains with (empty: it reads no `ssl`).
  validate(config): builds the method's typed sub-configs from an `ExperimentConfig`, which validates
    them (raises ValueError naming the bad value), and returns them; called once, when the config is
    made, which keeps them (`ExperimentConfig.parsed`).
  build(config, model, image_shape, context): the method's process (federated methods: a
    `tff_ssl.federated.process.FederatedProcess`; `context` a `process.BuildContext`) over a
    `FunctionalModel`, with `initialize()` and `next(state, clients, *, client_ids, store)`; it reads
    its typed sub-configs from `config.parsed` (what `validate` returned), never parsing them again.
  min_samples(config): the fewest images a client can train on.
  divergence_hint(config): what to change when the loss became NaN (appended to the error).
  no_batch_heads: why the method cannot train with batch-statistics heads (`--head_norm=batch`);
    empty: it can.
  no_privacy: why the method refuses --dp, --secure_aggregation and --compression (it does not
    read them); empty: it reads them, or is not federated.
  dp_releases: the private releases a round makes under --dp (DCCO: its statistics and its update),
    which the accounting composes.
  auxiliary: the method's server trains on unlabeled images of its own (LW-FedSSL's calibration):
    the runner holds `config.auxiliary_fraction` of the training images out of the clients' data
    and passes them in the build context (`BuildContext.auxiliary`: {"images": ..., "ids": ...}).
  """

  name: str
  kind: str
  summary: str
  fields: tuple[str | Field, ...] = ()
  ssl: tuple[str, ...] = ()
  validate: Callable[[Any], Any] = _no_check
  build: Callable[..., Any] | None = None
  min_samples: Callable[[Any], int] = lambda config: 1
  divergence_hint: Callable[[Any], str] | None = None
  no_batch_heads: str = ""
  auxiliary: bool = False
  no_privacy: str = ""
  dp_releases: int = 1

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"method {self.name!r}: unknown kind {self.kind!r}; choose one of "
                       f"{list(KINDS)}")
    if self.auxiliary and "auxiliary_fraction" not in self.field_names:
      raise ValueError(f"method {self.name!r}: a method with an auxiliary split reads "
                       f"auxiliary_fraction (add it to its fields)")
    if (self.kind == "federated") != (self.build is not None):
      raise ValueError(f"method {self.name!r}: a federated method needs `build` (and only it)")
    unknown = [s for s in self.ssl if s not in ssl_lib.SSL_METHODS]
    if unknown:
      raise ValueError(f"method {self.name!r}: unknown SSL method {unknown[0]!r}; choose from "
                       f"{sorted(ssl_lib.SSL_METHODS)}")

  @property
  def field_names(self) -> tuple[str, ...]:
    """The names of the fields it reads (beyond the common ones and its SSL method's)."""
    return tuple(f.name if isinstance(f, Field) else f for f in self.fields)

  @property
  def declared(self) -> tuple[Field, ...]:
    """The fields it declares (`Field`s among `fields`)."""
    return tuple(f for f in self.fields if isinstance(f, Field))

  @property
  def federated(self) -> bool:
    return self.kind == "federated"

  @property
  def length_field(self) -> str:
    """The field that sets the run's length: rounds (federated) or steps."""
    return "rounds" if self.federated else "steps"

  @property
  def lr_field(self) -> str:
    """The learning rate a table's pilots choose: the server's (federated) or the optimizer's."""
    return "server_learning_rate" if self.federated else "learning_rate"

  def reads(self, config) -> tuple[str, ...]:
    """Every method-specific field this method reads with `config`'s SSL method."""
    if not self.ssl:
      return self.field_names
    return self.field_names + ("ssl",) + ssl_lib.get(config.ssl).hparams

  def check(self, config) -> Any:
    """Validates `config` for this method: its SSL method, then its typed sub-configs, which it
    returns (`validate`'s value)."""
    if self.ssl and config.ssl not in self.ssl:
      raise ValueError(f"method {self.name!r} trains with ssl in {list(self.ssl)}; got "
                       f"ssl={config.ssl!r}")
    if self.no_privacy:
      set_ = [f.name for f in privacy.FIELDS if getattr(config, f.name, f.default) != f.default]
      if set_:
        raise ValueError(f"--{set_[0]} is refused by method {self.name!r}: {self.no_privacy}")
    return self.validate(config)

  def hint(self, config) -> str:
    """What to try when a run's loss became NaN or infinite."""
    if self.divergence_hint is not None:
      return self.divergence_hint(config)
    rate = "server_learning_rate" if self.federated else "learning_rate"
    return f"lower --{rate} (now {getattr(config, rate)})"
