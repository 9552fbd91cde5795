"""A round as a sequence of phases, each a broadcast, a client computation and an aggregation, with
results passed by name: how every process assembles its round's federated computation.

    round(arguments[, aggregator_states])            the arguments: (name, federated type) pairs
      for each phase, in order:
        broadcast what it reads at SERVER            an argument or an earlier phase's result
                                                     (each broadcast once a round), and its
                                                     aggregation's params
        out = federated_map(client, its reads)       at CLIENTS
        Aggregated(result, state, measurements)      its aggregation of (value(out), weight(out))
        names.update(results(aggregated, out, names)) what later phases and the round may read
      return {name: names[name] for the outputs}[ + aggregator_states: their new states]

A phase whose aggregation keeps state (a DP release's query state, a weighted factory's) has a slot
under its name in the round's `aggregator_states` argument and output; their initial states come
from `initialize`. `computation(phases, given)` builds the round over some of the phases, taking the
earlier results they read (`given`) as SERVER arguments: DCCO's two phases as one computation, as
two (TFF's mergeable execution across workers) and its update phase alone (stale statistics) are
one list of phases. Composition is checked: every name a phase reads exists before it, names are
not produced twice, the outputs exist.

TFF's `tff.learning.templates.compose_learning_process` is the model (typed parts, each with its
state); its parts are fixed (distributor, client work, aggregator, finalizer) and its client work
consumes `tf.data` batches of a supervised `tff.learning` model, so the phases here are our own.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class Aggregated:
  """A phase's aggregation: its result, its new state (None: stateless) and measurements (None:
  none), all at SERVER."""
  result: Any
  state: Any = None
  measurements: Any = None


class Aggregation:
  """How a phase's client values become one value at the server (stateless by default)."""

  stateful = False

  def initialize(self):
    """Federated: the state at SERVER (stateful aggregations)."""
    raise NotImplementedError

  def params(self, state):
    """Federated: what the phase's clients read of the state (`"params"`; None: nothing)."""
    del state
    return None

  def __call__(self, state, value, weight) -> Aggregated:
    raise NotImplementedError


class Mean(Aggregation):
  """The weighted mean (`tff.federated_mean`)."""

  def __call__(self, state, value, weight) -> Aggregated:
    del state
    return Aggregated(tff.federated_mean(value, weight=weight))


class Factory(Aggregation):
  """A `tff.templates.AggregationProcess` (a `tff.aggregators` factory's): weighted where the phase
  gives a weight, else unweighted."""

  stateful = True

  def __init__(self, process, params: Callable | None = None):
    self.process, self._params = process, params

  def initialize(self):
    return self.process.initialize()

  def params(self, state):
    """`params(state)` where given (e.g. a grouped strategy's client argument), else None."""
    return None if self._params is None else self._params(state)

  def __call__(self, state, value, weight) -> Aggregated:
    out = (self.process.next(state, value) if weight is None
           else self.process.next(state, value, weight))
    return Aggregated(out.result, out.state, out.measurements)


class Release(Aggregation):
  """A private release (`privacy.release.ReleaseProcess`): the clients clip with its params; the
  measurements are its diagnostics (`release_of`)."""

  stateful = True

  def __init__(self, process):
    self.process = process

  def initialize(self):
    return self.process.initialize()

  def params(self, state):
    return self.process.params(state)

  def __call__(self, state, value, weight) -> Aggregated:
    del weight  # A release sums its records; its denominator is public.
    result, new_state, measured = self.process.release_of(state, value)
    return Aggregated(result, new_state, measured)


def first(out, at):
  del at
  return out[0]


def second(out, at):
  del at
  return out[1]


@dataclasses.dataclass(frozen=True)
class Phase:
  """One broadcast, client computation and aggregation (module docstring).

  client: a TFF computation whose parameters are the values `reads` names, in order ("params": its
    aggregation's params).
  value, weight: what of the clients' output `out` is aggregated, and with what weight (None:
    unweighted), as functions of `out` and of what the clients read (name -> value at CLIENTS).
  gives, results: the names it adds, and (Aggregated, out, the round's names so far) -> an
    OrderedDict of their values.
  """

  name: str
  client: Any
  reads: tuple[str, ...]
  aggregation: Aggregation
  gives: tuple[str, ...]
  results: Callable[[Aggregated, Any, dict], dict]
  value: Callable = first
  weight: Callable | None = second


class Round:
  """A round of `phases` over the named `arguments` ((name, federated type) pairs), giving back
  `outputs` (module docstring); `derived`: (name, fn(names) -> value) pairs computed from the
  arguments before the first phase (e.g. the clients' optional parts, `round_parts`)."""

  def __init__(self, arguments: Sequence[tuple[str, tff.Type]], phases: Sequence[Phase],
               outputs: Sequence[str], derived: Sequence[tuple[str, Callable]] = ()):
    self.arguments, self.phases, self.outputs = list(arguments), list(phases), tuple(outputs)
    self.derived = list(derived)
    if len(set(p.name for p in self.phases)) != len(self.phases):
      raise ValueError(f"a round's phases need distinct names; got {[p.name for p in phases]}")
    self._initialize = None

  @property
  def stateful(self) -> list[Phase]:
    return [p for p in self.phases if p.aggregation.stateful]

  def initialize(self):
    """The stateful phases' initial states, {phase: state}."""
    return self.initialize_fn()()

  def initialize_fn(self):
    """The TFF computation of the initial states (built once)."""
    if self._initialize is None:
      stateful = self.stateful

      @tff.federated_computation()
      def initialize():
        return tff.federated_zip(collections.OrderedDict(
            (p.name, p.aggregation.initialize()) for p in stateful))

      self._initialize = initialize
    return self._initialize

  def state_type(self) -> tff.Type:
    return self.initialize_fn().type_signature.result

  def computation(self, phases: Sequence[str] | None = None,
                  given: Sequence[tuple[str, tff.Type]] = (), outputs: Sequence[str] | None = None,
                  order: Sequence[str] | None = None, single: bool = False):
    """The round over `phases` (default all, in order), taking earlier results they read as the
    arguments `given` after the round's own, and `aggregator_states` where a phase is stateful
    (`order`: the parameters' order; default that one, SERVER-placed first); it returns `outputs`
    (default the round's) and, then, `aggregator_states` (`single`: the one output itself, for a
    stateless round)."""
    chosen = [p for p in self.phases if phases is None or p.name in phases]
    outputs = self.outputs if outputs is None else tuple(outputs)
    stateful = [p for p in chosen if p.aggregation.stateful]
    parameters = self.arguments + list(given)
    if stateful:
      parameters.append(("aggregator_states", tff.FederatedType(tff.StructType(
          [(p.name, self.state_type().member[p.name]) for p in stateful]), tff.SERVER)))
    if order is None:
      # SERVER-placed parameters first: TFF 0.87's mergeable execution (across --workers) splits
      # the argument's CLIENTS-placed values in order, and a SERVER value after one reached the
      # subrounds wrong (FedAvg with a stateful strategy: updates 1.14 apart,
      # tests/federated/test_across_workers.py).
      parameters.sort(key=lambda p: p[1].placement is tff.CLIENTS)
    else:
      by_name = dict(parameters)
      if sorted(order) != sorted(by_name):
        raise ValueError(f"order {list(order)} must name each parameter {sorted(by_name)} once")
      parameters = [(n, by_name[n]) for n in order]
    if single and (len(outputs) != 1 or stateful):
      raise ValueError(f"single: a stateless round of one output; got {outputs}")
    self._check(chosen, [n for n, _ in parameters], outputs)
    placement = dict(parameters)

    def body(args):
      names = collections.OrderedDict((n, args[n]) for n, _ in parameters)
      for name, fn in self.derived:
        names[name] = fn(names)
      broadcast = {}

      def at_clients(name):
        value = names[name]
        at_server = name in placement and placement[name].placement is tff.SERVER
        if at_server or (name not in placement and value.type_signature.placement is tff.SERVER):
          if name not in broadcast:
            broadcast[name] = tff.federated_broadcast(value)
          return broadcast[name]
        return value

      new_states = collections.OrderedDict()
      for p in chosen:
        state = names["aggregator_states"][p.name] if p.aggregation.stateful else None
        params = p.aggregation.params(state)
        reads = collections.OrderedDict(
            (r, tff.federated_broadcast(params) if r == "params" else at_clients(r))
            for r in p.reads)
        out = tff.federated_map(p.client, tuple(reads.values()))
        aggregated = p.aggregation(state, p.value(out, reads),
                                   None if p.weight is None else p.weight(out, reads))
        if p.aggregation.stateful:
          new_states[p.name] = aggregated.state
        added = p.results(aggregated, out, names)
        if tuple(added) != p.gives:
          raise ValueError(f"phase {p.name!r} declares {p.gives} and gave {tuple(added)}")
        names.update(added)
      if single:
        return names[outputs[0]]
      result = collections.OrderedDict((n, names[n]) for n in outputs)
      if new_states:
        result["aggregator_states"] = tff.federated_zip(new_states)
      return result

    @tff.federated_computation(tff.StructType(parameters))
    def run(args):
      return body(args)

    return run

  def _check(self, chosen, available, outputs) -> None:
    known = set(available) | {n for n, _ in self.derived}
    for p in chosen:
      missing = [r for r in p.reads if r != "params" and r not in known]
      if missing:
        raise ValueError(f"phase {p.name!r} reads {missing}, which no argument or earlier phase "
                         f"gives (known: {sorted(known)})")
      twice = known.intersection(p.gives)
      if twice:
        raise ValueError(f"phase {p.name!r} gives {sorted(twice)}, which the round already has")
      known.update(p.gives)
    missing = [n for n in outputs if n not in known]
    if missing:
      raise ValueError(f"the round's outputs {missing} are given by none of its phases "
                       f"{[p.name for p in chosen]} or arguments")
