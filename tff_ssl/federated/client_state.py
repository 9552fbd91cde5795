"""What a client keeps between the rounds it takes part in, and where it is kept: on disk, by client id.

A stateful method declares a `ClientState`: the structure of one client's state, its initial value,
and what the client does with it in a round (where local training starts from, what it keeps after).
Its TFF computations take each sampled client's state as a CLIENTS-placed value and return the new
state the same way (in the grouped simulation a slot's value is its clients' states stacked on a
leading axis).

Between rounds the states live in a `ClientStateStore`, not in memory: only the round's sampled
clients' states are read and written, so the Python process's memory does not grow with the client
pool. `DiskClientStateStore` keeps, per client that has participated, versioned files

    <root>/<id // 1000>/<id>/<v>.npz     the client's state after v rounds of the run (v = r + 1 when
                                          written by round r), written to a temporary file and renamed
    <root>/journal/<r>.json              ids whose state round r writes, written before those files

so a run resumed from the checkpoint after R rounds first `rollback(R)`s (removes every version > R:
the journals of rounds >= R name them) and then reads, for round r, each client's newest version
<= r: a crash between two checkpoints loses nothing and duplicates nothing. `prune(R)` drops versions
that no checkpoint >= R can need (each client keeps its newest version <= R and any newer ones).
"""

from __future__ import annotations

import abc
import json
import os
import tempfile
from typing import Any, Sequence

import numpy as np
import tensorflow as tf


class ClientState(abc.ABC):
  """A method's per-client state (see the module docstring).

  `spec(model)` is the nested structure of `tf.TensorSpec`s of one client's state; `initial(model)`
  its value (NumPy) for a client that has not participated yet. `begin` and `end` run inside the
  client's TFF computation, in TensorFlow, on one client.
  """

  @abc.abstractmethod
  def spec(self, model) -> Any:
    """The structure of one client's state (nested `tf.TensorSpec`s)."""

  def initial(self, model) -> Any:
    """A new client's state (default: zeros of `spec`)."""
    return tf.nest.map_structure(lambda s: np.zeros(s.shape, s.dtype.as_numpy_dtype),
                                 self.spec(model))

  def context_spec(self, model) -> Any:
    """The structure (nested `tf.TensorSpec`s) of what the server broadcasts to every client of a
    round beside the weights, from its method state (`ServerLoop.client_context`); None (default):
    nothing. `begin` and `end` receive it as `context`."""
    del model
    return None

  def begin(self, state, weights: list, context=None) -> list:
    """The weights (all the model's tensors) the client's local training starts from, given the
    broadcast ones (default: the broadcast weights)."""
    del state, context
    return list(weights)

  def ssl_state(self, state, start: list, context=None, client_id=None) -> dict | None:
    """What the client's local training carries across its steps (`tff_ssl.federated.client_work`:
    "target", its EMA target network; "queue", MoCo's negative keys; a client term's entry, e.g.
    FedFoA's bank and running sums) at the start of local training from `start`; entries it leaves
    out start fresh (default None: all of them, as FedAvg-style clients). `client_id`: the client's
    id (a scalar int64 tensor) where the round's clients report (a client term's `report_spec`),
    else None."""
    del state, start, context, client_id
    return None

  def measurements(self, states: Sequence[Any]) -> dict:
    """On the server: what the round's new client states (NumPy, one per client that took part, in
    `spec`'s structure) add to the round's measurements (aggregation.csv); default none. A
    diagnostic of the simulation, which holds every client's state: a deployed client keeps it."""
    del states
    return {}

  @abc.abstractmethod
  def end(self, state, weights: list, delta: list, num_examples, loss, ssl_state=None,
          context=None) -> Any:
    """The client's new state after local training that uploads `delta` (= broadcast - trained, of
    the trained tensors `weights` broadcast) on `num_examples` images with mean loss `loss`;
    `ssl_state`: what the SSL method carried to the end of local training (a dict, see above);
    `context`: the round's broadcast context (`context_spec`)."""


def stack(states: Sequence[Any]) -> Any:
  """Per-client states (same structure) stacked on a new leading axis: a grouped slot's value."""
  return tf.nest.map_structure(lambda *xs: np.stack([np.asarray(x) for x in xs]), *states)


def unstack(stacked: Any, count: int) -> list[Any]:
  """The inverse of `stack` for `count` clients."""
  return [tf.nest.map_structure(lambda x, k=k: np.asarray(x)[k], stacked) for k in range(count)]


class ClientStateStore(abc.ABC):
  """Per-client states by client id, versioned by the number of rounds completed."""

  @abc.abstractmethod
  def read(self, client_ids: Sequence[int], round_num: int, initial: Any) -> list[Any]:
    """The states of `client_ids` at the start of round `round_num` (their newest version <=
    round_num); `initial` for a client without one."""

  @abc.abstractmethod
  def write(self, client_ids: Sequence[int], states: Sequence[Any], round_num: int) -> None:
    """Stores the states that round `round_num` produced (version round_num + 1)."""

  def rollback(self, rounds_done: int) -> None:
    """Forgets every version written by a round >= `rounds_done` (resuming from that checkpoint)."""

  def prune(self, oldest_checkpoint: int) -> None:
    """Drops versions no resume from a checkpoint >= `oldest_checkpoint` can need."""

  def disk_bytes(self) -> int:
    return 0


class MemoryClientStateStore(ClientStateStore):
  """The store in memory (tests, diagnostics): same semantics as the disk store."""

  def __init__(self):
    self._versions: dict[int, dict[int, Any]] = {}

  def read(self, client_ids, round_num, initial):
    out = []
    for cid in client_ids:
      versions = [v for v in self._versions.get(int(cid), {}) if v <= round_num]
      out.append(self._versions[int(cid)][max(versions)] if versions else initial)
    return out

  def write(self, client_ids, states, round_num):
    for cid, state in zip(client_ids, states):
      self._versions.setdefault(int(cid), {})[round_num + 1] = state

  def rollback(self, rounds_done):
    for versions in self._versions.values():
      for v in [v for v in versions if v > rounds_done]:
        del versions[v]

  def clients(self) -> list[int]:
    """Ids of the clients with a stored state."""
    return sorted(c for c, v in self._versions.items() if v)


class DiskClientStateStore(ClientStateStore):
  """The store as versioned `.npz` files under `root` (see the module docstring)."""

  def __init__(self, root: str):
    self.root = root
    self._journal = os.path.join(root, "journal")
    os.makedirs(self._journal, exist_ok=True)

  def _client_dir(self, cid: int) -> str:
    return os.path.join(self.root, str(cid // 1000), str(cid))

  def _versions(self, cid: int) -> list[int]:
    try:
      names = os.listdir(self._client_dir(cid))
    except FileNotFoundError:
      return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".npz") and n[:-4].isdigit())

  def _path(self, cid: int, version: int) -> str:
    return os.path.join(self._client_dir(cid), f"{version}.npz")

  def read_flat(self, client_id: int, round_num: int) -> list[np.ndarray] | None:
    """The flattened state of one client at the start of round `round_num` (None: no version)."""
    versions = [v for v in self._versions(int(client_id)) if v <= round_num]
    if not versions:
      return None
    with np.load(self._path(int(client_id), versions[-1])) as f:
      return [f[f"t{i}"] for i in range(len(f.files))]

  def read(self, client_ids, round_num, initial):
    out = []
    for cid in client_ids:
      flat = self.read_flat(cid, round_num)
      out.append(initial if flat is None else tf.nest.pack_sequence_as(initial, flat))
    return out

  def write(self, client_ids, states, round_num):
    ids = [int(c) for c in client_ids]
    _write_atomic(os.path.join(self._journal, f"{round_num}.json"),
                  lambda f: f.write(json.dumps(ids).encode()))
    for cid, state in zip(ids, states):
      os.makedirs(self._client_dir(cid), exist_ok=True)
      flat = {f"t{i}": np.asarray(x) for i, x in enumerate(tf.nest.flatten(state))}
      _write_atomic(self._path(cid, round_num + 1), lambda f, flat=flat: np.savez(f, **flat))

  def _journal_rounds(self) -> list[int]:
    return sorted(int(n[:-5]) for n in os.listdir(self._journal)
                  if n.endswith(".json") and n[:-5].isdigit())

  def _journal_ids(self, r: int) -> list[int]:
    with open(os.path.join(self._journal, f"{r}.json")) as f:
      return json.load(f)

  def rollback(self, rounds_done):
    for r in self._journal_rounds():
      if r < rounds_done:
        continue
      for cid in self._journal_ids(r):
        for v in self._versions(cid):
          if v > rounds_done:
            os.remove(self._path(cid, v))
      os.remove(os.path.join(self._journal, f"{r}.json"))

  def prune(self, oldest_checkpoint):
    for r in self._journal_rounds():
      if r + 1 > oldest_checkpoint:
        break
      for cid in self._journal_ids(r):
        versions = self._versions(cid)
        keep = max([v for v in versions if v <= oldest_checkpoint], default=None)
        for v in versions:
          if keep is not None and v < keep:
            os.remove(self._path(cid, v))
      os.remove(os.path.join(self._journal, f"{r}.json"))

  def disk_bytes(self) -> int:
    total = 0
    for dirpath, _, files in os.walk(self.root):
      total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total

  def clients(self) -> list[int]:
    """Ids of the clients with a stored state (walks the folder: for tests and tools)."""
    out = []
    for shard in os.listdir(self.root):
      if shard.isdigit():
        out.extend(int(c) for c in os.listdir(os.path.join(self.root, shard))
                   if self._versions(int(c)))
    return sorted(out)



def _write_atomic(path: str, write) -> None:
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
