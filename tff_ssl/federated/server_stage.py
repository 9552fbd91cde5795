"""Server-side plug-ins of the FedAvg-style round: the server's counterpart of `client_work.ClientTerm`.

A `ServerStage` is what a method adds to the round on the server, with what its clients need for it:

    key               its entry in the server's `method_state` and in the round's broadcast context
    initial_state     its part of the method state (checkpointed and restored with the rest)
    context           what it broadcasts to the round's clients beside the weights (None: nothing);
                      its clients read it at `context[key]`
    client_state      the clients' state it needs, given the one the method has so far (None: none)
    terms             its client terms (`ClientTerm`s: what it adds to local training, its reports)
    aggregation       the aggregation factory it needs, given the method's (None: the default)
    before_optimizer  what it does with the round's aggregate: (the update the server optimizer
                      takes, its new part of the method state, measurements for aggregation.csv)
    after_optimizer   what it does with the new global weights (default: nothing)

Stages compose, folded into a host by one function (`fold`). What each does to the round is
declared, and checked when composed:

    client_state_role  "provides": the clients' state is its own (it takes none: FedLAMA's own
                       model); "wraps": it wraps the state the clients keep (FedFoA); "": neither
    changes_update     its `before_optimizer` / `after_optimizer` change what the server optimizer
                       takes or gives (FedLAMA: the layers not aggregated; FedU²'s EUA: the update)
    chooses_aggregation  its `aggregation` replaces the method's factory (FedLAMA's discrepancy)

The provider's state is made first and the wrapper wraps it, whatever the stages' order; terms are
added and updates taken in the stages' order. So the order changes nothing where at most one stage
provides the state, one wraps it, one changes the update and one chooses the aggregation (FedLAMA
and FedFoA, either way round, give the same round to the bit: tests/methods/test_fedlama.py); where
two would, their order could change the round and `fold` refuses them in one line. A stage that
overrides `client_state` or `aggregation` without declaring it is refused too. (Two stages with
loss terms add them in the given order: the same loss, summed in another order.)
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

from tff_ssl.federated import client_state as client_state_lib


class ServerStage:
  """A server-side plug-in (module docstring). Subclasses override what they use and declare what
  they change."""

  key: str = ""
  client_state_role: str = ""  # "provides", "wraps" or "" (module docstring).
  changes_update: bool = False
  chooses_aggregation: bool = False

  def check(self, model) -> None:
    """ValueError where `model` cannot take this stage (default: any model can)."""
    del model

  def initial_state(self) -> Any:
    """Its part of the server's method state before the first round (NumPy structure)."""
    return ()

  def context(self, part, round_num: int) -> Any:
    """What it broadcasts to round `round_num`'s clients, from its part of the method state (its
    client state's `context_spec()[key]`); None: nothing."""
    del part, round_num
    return None

  def client_state(self, inner: client_state_lib.ClientState | None,
                   model) -> client_state_lib.ClientState | None:
    """The clients' state with this stage, given `inner`, the one without it (default: `inner`)."""
    del model
    return inner

  def terms(self) -> tuple:
    """Its client terms (`client_work.ClientTerm`s), added after the method's own."""
    return ()

  def aggregation(self, factory):
    """The aggregation factory of the round with this stage, given the method's (None: FedAvg)."""
    return factory

  def before_optimizer(self, part, round_num: int, update: list, out: dict):
    """(The update the server optimizer takes, the stage's new part of the method state,
    measurements) from the round's `update` (the aggregate after the stages before this one) and
    its outputs `out` (`reports`, `measurements`, ...: `FedAvgSSLProcess.compute_update`)."""
    del round_num, out
    return update, part, {}

  def after_optimizer(self, part, round_num: int, old_weights: list, new_weights: list) -> list:
    """The new global weights after the optimizer step, given the ones before the round (`part`:
    the stage's method state at the start of the round)."""
    del part, round_num, old_weights
    return new_weights


ROLES = ("", "provides", "wraps")


def check(stages: Sequence[ServerStage]) -> None:
  """ValueError (one line) where the stages cannot compose: the same key twice, an unknown role, an
  undeclared client state or aggregation, two stages that both provide the clients' state, wrap it,
  change the update or choose the aggregation."""
  keys = [s.key for s in stages]
  if len(set(keys)) != len(keys) or not all(keys):
    raise ValueError(f"server stages need distinct, non-empty keys; got {keys}")
  for s in stages:
    if s.client_state_role not in ROLES:
      raise ValueError(f"server stage {s.key!r}: client_state_role must be one of {ROLES}; got "
                       f"{s.client_state_role!r}")
    if type(s).client_state is not ServerStage.client_state and not s.client_state_role:
      raise ValueError(f"server stage {s.key!r} makes the clients' state: declare its "
                       f"client_state_role ('provides' or 'wraps')")
    if type(s).aggregation is not ServerStage.aggregation and not s.chooses_aggregation:
      raise ValueError(f"server stage {s.key!r} chooses the aggregation: declare "
                       f"chooses_aggregation = True")
  for what, of in (("provide the clients' state", lambda s: s.client_state_role == "provides"),
                   ("wrap the clients' state", lambda s: s.client_state_role == "wraps"),
                   ("change the round's update", lambda s: s.changes_update),
                   ("choose the aggregation", lambda s: s.chooses_aggregation)):
    both = [s.key for s in stages if of(s)]
    if len(both) > 1:
      raise ValueError(f"server stages {both[0]!r} and {both[1]!r} both {what}, so their order "
                       f"would change the round; use one of them")


def fold_client_state(stages: Sequence[ServerStage], inner, model):
  """The clients' state with `stages`, given the host's `inner`: the providers' first, then the
  others' in order (wrappers wrap what is there by then)."""
  for s in sorted(stages, key=lambda s: s.client_state_role != "provides"):
    inner = s.client_state(inner, model)
  return inner


def fold(stages: Sequence[ServerStage], model, client_state, config, factory):
  """(client state, client config, aggregation factory) of a host with `stages` folded in: each
  checks the model, the client state is wrapped (`fold_client_state`), the terms are added and the
  factory chosen in the stages' order (`check` first)."""
  check(stages)
  for s in stages:
    s.check(model)
  client_state = fold_client_state(stages, client_state, model)
  config = config.with_terms(*(t for s in stages for t in s.terms()))
  for s in stages:
    factory = s.aggregation(factory)
  return client_state, config, factory


def initial_state(stages: Sequence[ServerStage]):
  """The method state of a round with `stages`: each stage's part under its key (`()`: none)."""
  if not stages:
    return ()
  check(stages)
  return collections.OrderedDict((s.key, s.initial_state()) for s in stages)


def context(stages: Sequence[ServerStage], method_state, round_num: int, spec) -> Any:
  """The round's broadcast context: each stage's under its key, in the order of the clients' context
  `spec` (`ClientState.context_spec`)."""
  given = {s.key: s.context(method_state[s.key], round_num) for s in stages}
  missing = [k for k in spec if given.get(k) is None]
  if missing:
    raise ValueError(f"the clients' state reads the broadcast context {missing}, which no server "
                     f"stage gives (stages: {list(given)})")
  return collections.OrderedDict((k, given[k]) for k in spec)


def before_optimizer(stages: Sequence[ServerStage], method_state, round_num: int, out: dict):
  """(Update, new method state, measurements) after every stage in order."""
  update, parts, measured = out["update"], collections.OrderedDict(), collections.OrderedDict()
  for s in stages:
    update, parts[s.key], m = s.before_optimizer(method_state[s.key], round_num, update, out)
    measured.update(m)
  return update, (parts if stages else None), measured


def after_optimizer(stages: Sequence[ServerStage], method_state, round_num: int, old_weights: list,
                    new_weights: list) -> list:
  """The new global weights after every stage's `after_optimizer` in order."""
  for s in stages:
    new_weights = s.after_optimizer(method_state[s.key], round_num, old_weights, new_weights)
  return new_weights
