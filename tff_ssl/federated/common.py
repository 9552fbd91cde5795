"""The types and values every federated process passes around: a client's inputs and their TFF type,
flat vectors of tensors (what crosses the TFF boundary), the round's seed, views and encodings of a
client's images, and the collection of per-client values at the server. The rest of the shared round
is beside it: `masks.py` (the trained tensors), `local_steps.py` (the clients' optimizer steps),
`server_step.py` (the server state and its optimizer step)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.data.augment import AugmentConfig, two_views
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.models.layers import batch_segments


def client_input_type(image_shape: Sequence[int]) -> tff.StructType:
  """One client's round input: its images and their dataset indices (which key the augmentations)."""
  return tff.StructType([
      ("images", tff.TensorType(np.uint8, [None] + list(image_shape))),
      ("ids", tff.TensorType(np.int64, [None])),
  ])


def client_inputs(images: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
  """The value of `client_input_type` for one client."""
  return {"images": np.asarray(images, np.uint8), "ids": np.asarray(ids, np.int64)}


def tensors_type(specs: Sequence[tf.TensorSpec]) -> tff.StructType:
  """Tensors of `specs` as a TFF type: a list (a Python list inside TF computations, as TFF's own
  aggregators, e.g. `clipping_factory`, need: they `tf.nest` over the value)."""
  return tff.StructWithPythonType(
      [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in specs], list)


def weights_type(model: FunctionalModel) -> tff.StructType:
  """The model's weights as a TFF type (`tensors_type` of all its tensors)."""
  return tensors_type(model.weight_specs)


def flat_type(specs: Sequence[tf.TensorSpec]) -> tff.TensorType:
  """Tensors of `specs` (one dtype) as one flat vector: what an update crosses the TFF boundary as.

  TFF's runtime handles a struct element by element: a weighted `federated_mean` of the 53 tensors of
  a ResNet-14 + projector update and its return to Python cost ~50 ms where the same 3.3 MB as one
  tensor cost ~20 ms (`BUILD-notes.md`, "Grouped simulation")."""
  dtypes = {s.dtype for s in specs}
  if len(dtypes) != 1:
    raise ValueError(f"a flat vector needs tensors of one dtype; got {sorted(d.name for d in dtypes)}")
  return tff.TensorType(dtypes.pop().as_numpy_dtype, [sum(s.shape.num_elements() for s in specs)])


def flat_spec(specs: Sequence[tf.TensorSpec]) -> tf.TensorSpec:
  """`flat_type` as a `tf.TensorSpec`."""
  flat = flat_type(specs)
  return tf.TensorSpec(flat.shape, tf.as_dtype(flat.dtype))


def flatten(tensors) -> tf.Tensor:
  """The tensors' entries, concatenated in order (`flat_type`)."""
  return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unflatten(flat: np.ndarray, specs: Sequence[tf.TensorSpec]) -> list[np.ndarray]:
  """`flatten`'s inverse in NumPy: arrays of `specs`' shapes (views of `flat`)."""
  flat = np.asarray(flat)
  sizes = [s.shape.num_elements() for s in specs]
  if flat.shape != (sum(sizes),):
    raise ValueError(f"expected a flat vector of {sum(sizes)} entries; got shape {flat.shape}")
  parts = np.split(flat, np.cumsum(sizes)[:-1])
  return [p.reshape(s.shape) for p, s in zip(parts, specs)]


def unflatten_tensors(flat: tf.Tensor, specs: Sequence[tf.TensorSpec]) -> list[tf.Tensor]:
  """`flatten`'s inverse in TensorFlow: tensors of `specs`' shapes, from a `flat_type` vector."""
  sizes = [s.shape.num_elements() for s in specs]
  return [tf.reshape(p, s.shape) for p, s in zip(tf.split(flat, sizes), specs)]


def flat_weights(weights) -> np.ndarray:
  """The weights as one `flat_type` vector (what crosses the TFF boundary as a broadcast)."""
  return np.concatenate([np.asarray(w).reshape(-1) for w in weights])


SEED_TYPE = tff.TensorType(np.int64, [2])


def kernel_norms(names: Sequence[str], initial, weights) -> dict:
  """Each kernel's norm over its initial norm (`kernel_norm/<tensor>`), and their mean per kind
  (`kernel_norm_conv`, convolutions and projection shortcuts; `kernel_norm_dense`): how a run's
  aggregation changes the global model's scale (`--measure_weight_norms`, aggregation.csv)."""
  ratios, kinds = {}, {"conv": [], "dense": []}
  for name, w0, w in zip(names, initial, weights):
    if not name.endswith("/kernel"):
      continue
    base = float(np.linalg.norm(w0))
    ratio = float(np.linalg.norm(w)) / base if base else float("nan")
    ratios[name] = np.float32(ratio)
    kinds["dense" if "dense" in name else "conv"].append(ratio)
  out = {f"kernel_norm_{k}": np.float32(np.mean(v)) for k, v in kinds.items() if v}
  out["kernel_norm"] = ratios
  return out


def views(data, seed, augment: AugmentConfig):
  """The two views of a client's images for the round's seed, keyed by example id."""
  return two_views(data["images"] if isinstance(data, dict) else data.images, seed, augment,
                   data["ids"] if isinstance(data, dict) else data.ids)


def multiplied(data, m: int):
  """Augmentation multiplicity: a client's (or a slot's) images, each `m` times in a row, copy j of
  image i under id i * m + j, so that every copy gets views of its own (`views` keys them by id);
  a slot's client sizes ("sizes") m times theirs. `m` = 1: `data` itself."""
  if m == 1:
    return data
  field = lambda name: data[name] if isinstance(data, dict) else getattr(data, name)  # noqa: E731
  images, ids = field("images"), field("ids")
  copies = tf.tile(tf.range(m, dtype=ids.dtype), [tf.shape(ids)[0]])
  out = {"images": tf.repeat(images, m, axis=0), "ids": tf.repeat(ids, m) * m + copies}
  sizes = data.get("sizes") if isinstance(data, dict) else getattr(data, "sizes", None)
  if sizes is not None:
    out["sizes"] = sizes * m
  return out


def encode_views(model: FunctionalModel, weights, v1, v2):
  """Projections (F, G) of both views in one forward pass (GroupNorm is per-sample: exact)."""
  return encode_outputs(model, weights, v1, v2)[0]


def encode_outputs(model: FunctionalModel, weights, v1, v2) -> list[tuple[tf.Tensor, tf.Tensor]]:
  """(view 1, view 2) of each of the model's outputs (projections, then predictions if any), from
  one forward pass over both views."""
  with batch_segments(2):  # Batch-statistics heads normalize each view over its own images.
    out = model(list(weights), tf.concat([v1, v2], axis=0), training=True)
  return [tuple(tf.split(o, 2, axis=0)) for o in (out if isinstance(out, (list, tuple)) else [out])]


def collect(values, spec):
  """CLIENTS-placed `values` (each client's: the structure of `spec`, nested `tf.TensorSpec`s of one
  real client's value, stacked on a leading axis over the slot's real clients) concatenated at the
  SERVER, in the clients' order: a `tff.federated_aggregate` whose accumulator is the concatenation
  (TFF 0.87 has no `federated_collect`). What is collected is what the type signature shows
  leaving the clients."""
  stacked = tff.types.to_type(tf.nest.map_structure(
      lambda s: tff.TensorType(s.dtype.as_numpy_dtype, [None] + list(s.shape)), spec))

  @tff.tensorflow.computation
  def zero():
    return tf.nest.map_structure(lambda s: tf.zeros([0] + list(s.shape), s.dtype), spec)

  @tff.tensorflow.computation(stacked, stacked)
  def concat(a, b):
    return tf.nest.map_structure(lambda x, y: tf.concat([x, y], axis=0), a, b)

  @tff.tensorflow.computation(stacked)
  def identity(a):
    return a

  return tff.federated_aggregate(values, zero(), concat, concat, identity)


def num_examples(data) -> tf.Tensor:
  images = data["images"] if isinstance(data, dict) else data.images
  return tf.cast(tf.shape(images)[0], tf.float32)


def round_seed(seed: int, round_num: int) -> np.ndarray:
  """The seed a round broadcasts to its clients: (the run's seed, the round number); `round_of`
  reads the round back (the clients' learning-rate schedule)."""
  return np.array([seed, round_num], np.int64)


def round_of(seed) -> tf.Tensor:
  """The round number (float32) of a round's seed (`round_seed`)."""
  return tf.cast(seed[1], tf.float32)
