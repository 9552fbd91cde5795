"""The optional parts of a round, built once for every process that has them.

A process whose clients keep state (`client_state.ClientState`), or whose client terms report
(`client_work.ClientTerm.report_spec`), adds to its round, beside the weights, the seed and the data:

    states   CLIENTS   each sampled client's state (a grouped slot: its clients' states stacked)
    context  SERVER    what the server broadcasts to the round's clients beside the weights, from its
                       method state (the state's `context_spec`; e.g. FedFoA's bank, FedLAMA's
                       last aggregation rounds)
    ids      CLIENTS   each client's id, where the clients report
    reports  out       every client's report, collected at the SERVER (`common.collect`):
                       {"client": its id, term key: the term's report}

`RoundParts` builds their TFF types, the round's named parameter of the parts present (`parameter`:
`type_signature.parameter.states` etc. of the round `composer.Round` builds), the clients' value
of the parts (`at_clients`, `unpack`), the fold of a grouped slot's clients over their states and
ids (`fold`), and the Python values a round takes and gives back (`arguments`, `client_states`).
A process without client state or reports has none of them.
"""

from __future__ import annotations

import collections
import inspect
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.federated import client_work, common, grouping


def tff_type(spec, leading: Sequence = ()):
  """The TFF type of a nested structure of `tf.TensorSpec`s, each with `leading` dimensions first."""
  return tff.types.to_type(tf.nest.map_structure(
      lambda s: tff.TensorType(s.dtype.as_numpy_dtype, list(leading) + list(s.shape)), spec))


class RoundParts:
  """The optional parts of a round of a process with `client_state` (None: none) and clients trained
  per `client_config` (its terms' reports) over `model`, in the grouped simulation (a slot stacks its
  clients' values) or the reference one (module docstring)."""

  def __init__(self, client_state, client_config, model, grouped: bool):
    self.grouped = grouped
    slot = [None] if grouped else []
    self.state_type = self.context_type = self.ids_type = self.report_spec = None
    if client_state is not None:
      self.state_type = tff_type(client_state.spec(model), slot)
      context = client_state.context_spec(model)
      if context is not None:
        self.context_type = tff_type(context)
    terms = client_work.reporting_terms(client_config, model)
    if terms:
      # Each client's upload beside its update: its id and its terms' reports, collected at the
      # server.
      self.report_spec = collections.OrderedDict(
          [("client", tf.TensorSpec([], tf.int64))] + [(t.key, t.report_spec(model)) for t in terms])
      self.ids_type = tff.TensorType(np.int64, slot)

  @property
  def stateful(self) -> bool:
    return self.state_type is not None

  @property
  def reports(self) -> bool:
    return self.report_spec is not None

  @property
  def any(self) -> bool:
    """Whether the round has any optional part."""
    return self.stateful or self.reports

  @property
  def client_type(self):
    """What a client's computation takes beside the weights, seed and data: <[states][, context][,
    ids]> (None where the round has no optional part)."""
    if not self.any:
      return None
    return tff.types.to_type(collections.OrderedDict(
        ([("states", self.state_type)] if self.stateful else []) +
        ([("context", self.context_type)] if self.context_type is not None else []) +
        ([("ids", self.ids_type)] if self.ids_type is not None else [])))

  def tensorflow_computation(self, fn: Callable, leading: Sequence[tuple[str, tff.Type]]):
    """`fn(*leading, extra)` as a TFF TensorFlow computation over `leading` (name, type) pairs and,
    where the round has optional parts, their client value (`client_type`); `extra` is None where
    it has none. (TFF computations take no default arguments, so the arity is built here.)"""
    names, types = [n for n, _ in leading], [t for _, t in leading]
    if self.client_type is not None:
      names.append("extra")
      types.append(self.client_type)

    def computation(*args, **kwargs):  # TFF calls it with the parameters by name.
      values = list(args) + [kwargs[n] for n in names[len(args):]]
      return fn(*values) if len(values) > len(leading) else fn(*values, None)

    computation.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    return tff.tensorflow.computation(*types)(computation)

  def parameter(self, leading: Sequence[tuple[str, tff.Type]]) -> tff.StructType:
    """The round's named parameter: `leading` (name, federated type) pairs, then the parts."""
    parts = list(leading)
    if self.stateful:
      parts.append(("states", tff.FederatedType(self.state_type, tff.CLIENTS)))
    if self.context_type is not None:
      parts.append(("context", tff.FederatedType(self.context_type, tff.SERVER)))
    if self.ids_type is not None:
      parts.append(("ids", tff.FederatedType(self.ids_type, tff.CLIENTS)))
    return tff.StructType(parts)

  def at_clients(self, args):
    """In the round's federated computation: the parts as the clients take them (`client_type`,
    CLIENTS-placed; the context broadcast), or None where the round has none. `args`: the round's
    named parameter, or a dict of its values by name (`composer.Round`'s)."""
    if not self.any:
      return None
    get = args.__getitem__ if isinstance(args, dict) else lambda name: getattr(args, name)
    parts = collections.OrderedDict()
    if self.stateful:
      parts["states"] = get("states")
    if self.context_type is not None:
      parts["context"] = tff.federated_broadcast(get("context"))
    if self.ids_type is not None:
      parts["ids"] = get("ids")
    return tff.federated_zip(parts)

  def unpack(self, extra) -> tuple:
    """In a client's computation: (states, context, ids) of its `client_type` value (None where
    absent)."""
    if extra is None:
      return None, None, None
    return (extra["states"] if self.stateful else None,
            extra["context"] if self.context_type is not None else None,
            extra["ids"] if self.ids_type is not None else None)

  def fold(self, data, one_client: Callable, initial, states, ids):
    """`grouping.fold_clients` over a grouped slot's real clients with their states and ids:
    `acc, new_state, report = one_client(images_k, ids_k, state_k, id_k, acc)` (None where absent).
    Returns (acc, the slot's outputs: (its clients' new states stacked, if stateful) + (their
    reports, if they report))."""
    folded = tuple(x for x in (states, ids) if x is not None)
    if not folded:
      return grouping.fold_clients(
          data, lambda images, ids_k, acc: one_client(images, ids_k, None, None, acc)[0],
          initial), ()
    out_specs = (((tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), states),)
                  if states is not None else ()) +
                 ((self.report_spec,) if ids is not None else ()))

    def body(images, ids_k, inputs, acc):
      state = inputs[0] if states is not None else None
      client_id = inputs[-1] if ids is not None else None
      acc, new_state, report = one_client(images, ids_k, state, client_id, acc)
      return acc, (((new_state,) if states is not None else ()) +
                   ((report,) if ids is not None else ()))

    acc, outputs = grouping.fold_clients(data, body, initial, folded, out_specs)
    return acc, tuple(outputs)

  def collect_reports(self, reports):
    """In the round's federated computation: every client's (id, report) at the SERVER."""
    return common.collect(reports, self.report_spec)

  def arguments(self, client_states: Sequence | None, context, client_ids: Sequence[int] | None,
                slot_sizes: Sequence[int]) -> dict:
    """The round's Python values of the parts for clients in slots of `slot_sizes` (grouped; the
    reference simulation's slots hold one client each)."""
    out = {}
    size = max(slot_sizes)
    if self.stateful:
      out["states"] = (grouping.pack_states(client_states, size) if self.grouped
                       else list(client_states))
    if self.context_type is not None:
      out["context"] = context
    if self.ids_type is not None:
      if client_ids is None or len(client_ids) != sum(slot_sizes):
        raise ValueError("this process's clients report to the server: the round needs the "
                         "clients' ids (one per client)")
      ids = np.asarray(client_ids, np.int64)
      starts = np.cumsum([0] + list(slot_sizes[:-1]))
      out["ids"] = ([ids[s:s + n] for s, n in zip(starts, slot_sizes)] if self.grouped
                    else list(ids))
    return out

  def client_states(self, new, slot_sizes: Sequence[int]) -> list:
    """Each client's new state from the round's CLIENTS-placed output, in the clients' order."""
    return grouping.unpack_states(new, slot_sizes) if self.grouped else list(new)

  @staticmethod
  def reports_of(out) -> dict:
    """The round's collected reports as NumPy arrays (a leading axis over its clients): {"client":
    ids, term key: the term's reports}."""
    if isinstance(out, tff.structure.Struct):
      out = tff.structure.to_odict(out, recursive=True)
    return tf.nest.map_structure(np.asarray, dict(out))
