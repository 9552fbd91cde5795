"""Grouped simulation: one TFF client slot carries a group of real clients.

Naive simulation gives every real client its own TFF client slot, and TFF's runtime then pays a fixed
cost per slot per round (≈ 19 ms here, `shared/notes/tff-0.87.md`): 43× a centralized step for 512
one-image clients. In grouped mode the round's clients are packed into a few slots (by default one);
a slot's value is its clients' images and ids concatenated, plus their sizes:

    group = {images: uint8 [sum N_k, H, W, C], ids: int64 [sum N_k], sizes: int32 [K]}

so client data reaches the computation as one tensor per slot (no per-client `tf.data`), and inside the
slot's TensorFlow computation every real client's work is done and reduced to exactly the partial sums
the server's aggregation needs:

    value_g = sum_k w_k v_k / sum_k w_k,    weight_g = sum_k w_k        (k over the group's clients)

where (v_k, w_k) is what the client would have sent in reference mode (its update and N_k by
default). A weighted mean over groups of (value_g, weight_g) is then the weighted mean over clients of
(v_k, w_k), to float round-off. The reference mode (`Simulation(mode="reference")`: one real client per
slot, the processes' plain per-client computations) stays available; the equivalence tests
(`tests/federated/test_grouping.py`) compare the two.

How a group computes its clients' work:

* one local step, and a strategy whose client weight depends only on (N_k, L_k) (DCCO; FedAvg-style
  training with FedAvg, uniform or Loss weighting): the client update is eta * grad L_k, linear in the
  gradient, so sum_k b_k Delta_k = eta * grad(sum_k b_k L_k) with the weights b_k held fixed: one
  batched forward and backward pass over all the group's images, with the within-client losses
  evaluated per client on the batched projections (GroupNorm is per sample, so a client's
  projections do not depend on its batch mates). For DCCO, L_k = CCO(<>_k + stop_gradient(<>_A -
  <>_k)) has the value CCO(<>_A) and the gradient J(<>_A) d<>_k/dw, so sum_k N_k grad L_k = N_g grad
  CCO(<>_g + stop_gradient(<>_A - <>_g)): the group's own concatenation is, exactly, one client.
* otherwise (several local steps, or a strategy that needs each client's own update, such as L-DAWA's
  per-layer cosine delta_k^(l)): a `tf.while_loop` over the group's clients inside the one
  computation, each client training from the broadcast weights on its own slice; the aggregation
  strategy's per-client stage turns each client's update into (v_k, log b_k), folded into running
  sums. Clients still run one after another (their weights diverge), but without a TFF slot, a graph
  or a dispatch of their own.

Aggregation strategies (`tff_ssl.aggregators`) are written for this: each is a per-client stage
(update, N_k, L_k, broadcast weights) -> (v_k, log b_k) and a weighted mean. In reference mode the
strategy's TFF aggregation process runs the stage at CLIENTS; in grouped mode the slot runs it for
each of its real clients and sends the folded (sum b_k v_k / sum b_k, log sum b_k), and the server
stage is the same. A TFF factory that transforms each client's value non-linearly (norm clipping)
can only be exact per real client, so it composes with the strategies in reference mode.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.config_fields import Field
from tff_ssl.federated import client_state

MODES = ("grouped", "reference")
SIMULATION = Field("simulation", "grouped", "grouped (default): real clients packed into TFF client "
                   "slots, exact and fast; reference: one real client per TFF client slot.",
                   choices=MODES)
GROUP_SIZE = Field("group_size", 0, "Real clients per TFF client slot in grouped mode (0: the whole "
                   "round in one slot).", lower=0, note="0: one slot per round")


@dataclasses.dataclass(frozen=True)
class Simulation:
  """How a process simulates a round's clients.

  mode: "grouped" (real clients packed into TFF client slots) or "reference" (one per slot).
  group_size: real clients per slot in grouped mode; 0 puts the whole round in one slot.
  batch_one_step: in grouped mode, compute one-local-step, example-weighted rounds as one batched
    pass (exact, see the module docstring); False forces the per-client loop (for tests and profiles).
  """

  mode: str = "grouped"
  group_size: int = 0
  batch_one_step: bool = True

  def __post_init__(self):
    SIMULATION.check(self.mode)
    GROUP_SIZE.check(self.group_size)

  @property
  def grouped(self) -> bool:
    return self.mode == "grouped"


def group_input_type(image_shape: Sequence[int]) -> tff.StructType:
  """One slot's round input in grouped mode: its clients' images and ids concatenated, and sizes."""
  return tff.StructType([
      ("images", tff.TensorType(np.uint8, [None] + list(image_shape))),
      ("ids", tff.TensorType(np.int64, [None])),
      ("sizes", tff.TensorType(np.int32, [None])),
  ])


def pack(clients: Sequence[dict], group_size: int = 0) -> list[dict]:
  """Packs per-client inputs (`common.client_inputs`) into groups of `group_size` (0: one group)."""
  if not clients:
    raise ValueError("a round needs at least one client")
  size = group_size or len(clients)
  groups = []
  for start in range(0, len(clients), size):
    part = clients[start:start + size]
    groups.append({
        "images": np.concatenate([c["images"] for c in part], axis=0),
        "ids": np.concatenate([c["ids"] for c in part], axis=0).astype(np.int64),
        "sizes": np.array([len(c["ids"]) for c in part], np.int32),
    })
  return groups


def pack_states(states: Sequence, group_size: int = 0) -> list:
  """Per-client states, in the clients' order, stacked per group as `pack` groups the clients."""
  from_ = list(states)
  size = group_size or len(from_)
  return [client_state.stack(from_[start:start + size]) for start in range(0, len(from_), size)]


def unpack_states(stacked_groups: Sequence, sizes: Sequence[int]) -> list:
  """The per-client states of `pack_states`' groups (`sizes`: clients per group)."""
  out = []
  for stacked, count in zip(stacked_groups, sizes):
    out.extend(client_state.unstack(stacked, count))
  return out


def field(data, name: str):
  return data[name] if isinstance(data, dict) else getattr(data, name)


def fold_clients(group, body: Callable, initial, states=None, out_specs=None):
  """`acc = body(images_k, ids_k, acc)` for each real client k of `group`, in one `tf.while_loop`.

  `initial` is a (nested) structure of tensors with fixed shapes; returns the final accumulator. With
  `states` (the slot's client states, stacked on a leading axis: `client_state.stack`), the body is
  `acc, new_state_k = body(images_k, ids_k, state_k, acc)` and the result is (acc, the new states
  stacked likewise). `out_specs`: the structure (`tf.TensorSpec`s of one client) of what the body
  returns per client when it differs from `states`' (e.g. (new state, report) from (state, id)). The loop is built inside a `tf.function`: in the TF1-style graph of a TFF
  computation, `tf.while_loop` would otherwise keep every iteration's intermediates for a possible
  gradient of the loop (seen: the TFF worker at 6.7 GB and minutes per round for 10 clients x 5
  local steps).
  """

  @tf.function(autograph=False)  # The loop is explicit; autograph only re-parses the body.
  def loop(images, ids, sizes, initial, states):
    offsets = tf.cumsum(sizes, exclusive=True)
    count = tf.shape(sizes)[0]
    if states is None:
      outs = ()
    elif out_specs is None:
      outs = tf.nest.map_structure(
          lambda s: tf.TensorArray(s.dtype, size=count, element_shape=s.shape[1:]), states)
    else:
      outs = tf.nest.map_structure(
          lambda s: tf.TensorArray(s.dtype, size=count, element_shape=s.shape), out_specs)

    def step(k, acc, outs):
      start, n = offsets[k], sizes[k]
      if states is None:
        return k + 1, body(images[start:start + n], ids[start:start + n], acc), outs
      state_k = tf.nest.map_structure(lambda s: s[k], states)
      acc, new_state = body(images[start:start + n], ids[start:start + n], state_k, acc)
      outs = tf.nest.map_structure(lambda ta, s: ta.write(k, s), outs, new_state)
      return k + 1, acc, outs

    _, acc, outs = tf.while_loop(lambda k, *_: k < count, step, (tf.constant(0), initial, outs),
                                 parallel_iterations=1)
    if states is None:
      return acc
    return acc, tf.nest.map_structure(lambda ta: ta.stack(), outs)

  return loop(field(group, "images"), field(group, "ids"), field(group, "sizes"), initial, states)
