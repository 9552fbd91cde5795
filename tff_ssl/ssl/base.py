"""What a client SSL method is to the FedAvg process: heads, target network, and its loss.

A method's loss sees `Outputs` of the two views: the online projections z1, z2, the online
predictions p1, p2 (methods with a predictor head), the target network's projections t1, t2
(methods with a target network; within one round's local training the target is an exponential moving
average of the online weights, started from the broadcast model, so at the first local step t = z),
a queue of negative keys (MoCo: the target's projections of earlier steps, newest first), and the
encoder's features h1, h2 of the views where the model outputs them (LW-FedSSL's representation
alignment).

What a method carries from one local step to the next (its "SSL state": the target network, the
queue) starts fresh each round for FedAvg-style clients; a stateful client keeps it between rounds
(`tff_ssl.federated.client_state.ClientState.ssl_state`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import tensorflow as tf


class Outputs(NamedTuple):
  z1: Any
  z2: Any
  p1: Any = None
  p2: Any = None
  t1: Any = None
  t2: Any = None
  queue: Any = None
  h1: Any = None
  h2: Any = None


# The fields of `Outputs` that hold one row per image (all but the queue, shared by the batch).
ROWS = tuple(f for f in Outputs._fields if f != "queue")


@dataclasses.dataclass(frozen=True)
class SSLMethod:
  """A client SSL method for FedAvg-style training, declared in one module with its loss.

  loss(outputs, hparams) -> scalar; per_client_loss(outputs, sizes, hparams) -> [K] losses of clients
  whose rows are concatenated (the grouped simulation's batched pass), optional: without it
  `losses_per_client` loops over the clients. `hparams` is any object with the fields named in
  `hparams` (the FedAvg config); `fields` declares the hyperparameters this method introduces
  (`tff_ssl.ssl.HPARAMS` is assembled from the registry's), `hparams` may also name fields another
  method declares (MoCo reads SimCLR's `temperature`).
  """

  name: str
  loss: Callable[[Outputs, Any], Any]
  per_client_loss: Callable[[Outputs, Any, Any], Any] | None = None
  predictor: bool = False  # The online network ends in a predictor head.
  ema_target: bool = False  # A target network, the EMA of the online one during local training.
  queue: bool = False  # A queue of negative keys (`moco_queue` of them), t2 enqueued after each step.
  min_samples: int = 2  # Fewest images per client the loss is defined for.
  hparams: tuple[str, ...] = ()  # Config fields it reads (ExperimentConfig: the loss's and heads').
  # Its published heads, used with `--head_norm=batch`: batch normalization after the projector's
  # hidden layers ("hidden"), also a non-affine one on its output ("hidden+output"), or none at all
  # ("none"). A predictor has it after its hidden layer.
  batch_heads: str = "hidden"
  fields: tuple[Any, ...] = ()  # The hyperparameters it declares (`tff_ssl.config_fields.Field`).

  def losses_per_client(self, outputs: Outputs, sizes, hparams) -> tf.Tensor:
    """[K] the within-client losses of clients whose rows of `outputs` are concatenated client by
    client with the given sizes: `per_client_loss`, or a loop calling `loss` on each client's rows
    (every client against the same queue)."""
    if self.per_client_loss is not None:
      return self.per_client_loss(outputs, sizes, hparams)
    sizes = tf.convert_to_tensor(sizes, tf.int32)
    offsets = tf.cumsum(sizes, exclusive=True)
    rows = {name: getattr(outputs, name) for name in ROWS if getattr(outputs, name) is not None}
    dtype = outputs.z1.dtype

    def one(k):
      own = {name: x[offsets[k]:offsets[k] + sizes[k]] for name, x in rows.items()}
      return tf.cast(self.loss(outputs._replace(**own), hparams), dtype)

    return tf.map_fn(one, tf.range(tf.shape(sizes)[0]), fn_output_signature=dtype)
