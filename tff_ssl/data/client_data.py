"""Federated clients over one in-memory image set, as a `tff.simulation.datasets.ClientData`.

Clients are rows of a partition (`tff_ssl.data.partition`): each holds indices into the shared image
array, and its `tf.data.Dataset` gathers those rows when it is built. Nothing is copied per client, so
50,000 one-image clients cost one small index array. A partition is either a fixed-size
`[num_clients, samples_per_client]` array or a ragged list of 1-D index arrays (clients of unequal
sizes, e.g. `dirichlet_label_split`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.data.sources import ImageSet


class PartitionedClientData(tff.simulation.datasets.ClientData):
  """Clients `"0"`, `"1"`, ... whose examples are `{"image": uint8 [H, W, C], "label": int64}`."""

  def __init__(self, images: ImageSet, partition: np.ndarray | Sequence[np.ndarray]):
    """
    Args:
      images: the shared image set.
      partition: int array [num_clients, samples_per_client] of indices into `images`, or a list of
        num_clients non-empty 1-D int arrays of (possibly) different lengths. A list whose rows all
        have one length is stacked into the array form, as before ragged partitions existed.
    """
    super().__init__()
    partition = _as_partition(partition)
    if isinstance(partition, np.ndarray):
      if partition.ndim != 2 or partition.shape[0] < 1 or partition.shape[1] < 1:
        raise ValueError(f"partition must be a non-empty [num_clients, samples_per_client] array; "
                         f"got shape {partition.shape}")
      partition = partition.astype(np.int64)
      sizes = np.full(partition.shape[0], partition.shape[1], np.int64)
      flat = partition.ravel()
    else:
      sizes = np.array([row.size for row in partition], np.int64)
      flat = np.concatenate(partition)
    if flat.min() < 0 or flat.max() >= len(images):
      raise ValueError(f"partition indices must lie in [0, {len(images)}); got "
                       f"[{flat.min()}, {flat.max()}]")
    self._images = images
    self._partition = partition
    self._sizes = sizes
    # Clients as slices of one flat index array (offsets[k]:offsets[k + 1]), so that a traced
    # dataset_fn handles fixed-size and ragged partitions alike.
    self._flat = flat
    self._offsets = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
    self._client_ids = [str(i) for i in range(len(partition))]
    self._tensors = None  # Built on first eager use: (images, labels, flat, offsets) as tf constants.

  @property
  def image_set(self) -> ImageSet:
    return self._images

  @property
  def partition(self) -> np.ndarray | list[np.ndarray]:
    """The [num_clients, samples_per_client] array, or the list of ragged int64 index arrays."""
    return self._partition

  @property
  def client_ids(self) -> list[str]:
    return self._client_ids

  @property
  def num_clients(self) -> int:
    return len(self._partition)

  @property
  def is_ragged(self) -> bool:
    return not isinstance(self._partition, np.ndarray)

  @property
  def client_sizes(self) -> np.ndarray:
    """int64 [num_clients]: each client's number of samples."""
    return self._sizes

  @property
  def samples_per_client(self) -> int:
    """The common client size; a ragged partition has none (use `client_sizes`)."""
    if self.is_ragged:
      raise ValueError(f"clients have unequal sizes ({self._sizes.min()} to {self._sizes.max()}); "
                       f"use client_sizes")
    return self._partition.shape[1]

  def client_index(self, client_id: str) -> int:
    try:
      index = int(client_id)
    except (TypeError, ValueError):
      index = -1
    if not 0 <= index < self.num_clients or str(index) != client_id:
      raise ValueError(f"no client {client_id!r}: ids are '0' .. '{self.num_clients - 1}'")
    return index

  def client_arrays(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
    """A client's (images, labels) as NumPy arrays."""
    rows = self._partition[self.client_index(client_id)]
    return self._images.images[rows], self._images.labels[rows]

  def _constants(self):
    # Eager tensors, made once, serve eager code and every tf.function (which captures them). A TFF
    # computation traces into a plain graph that cannot capture them, so it gets constants of its own;
    # caching those would break the next trace, in another graph.
    if not (tf.executing_eagerly() or tf.inside_function()):
      return self._make_constants()
    if self._tensors is None:
      with tf.init_scope():  # Eager even when first called while a tf.function traces.
        self._tensors = self._make_constants()
    return self._tensors

  def _make_constants(self):
    return (tf.constant(self._images.images), tf.constant(self._images.labels),
            tf.constant(self._flat), tf.constant(self._offsets))

  @property
  def serializable_dataset_fn(self):
    def dataset_fn(client_id):
      images, labels, flat, offsets = self._constants()
      index = tf.strings.to_number(client_id, out_type=tf.int64)
      rows = flat[offsets[index]:offsets[index + 1]]
      return tf.data.Dataset.from_tensor_slices({
          "image": tf.gather(images, rows),
          "label": tf.gather(labels, rows),
      })
    return dataset_fn

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    self.client_index(client_id)  # O(1) validation (the base class scans the id list).
    return self.serializable_dataset_fn(client_id)

  @property
  def element_type_structure(self):
    return {
        "image": tf.TensorSpec(self._images.image_shape, tf.uint8),
        "label": tf.TensorSpec([], tf.int64),
    }


def _as_partition(partition) -> np.ndarray | list[np.ndarray]:
  """The array form of `partition`, or its list of int64 rows when the rows differ in length."""
  if isinstance(partition, np.ndarray):
    return partition
  rows = [np.asarray(row) for row in partition]
  if len({row.shape for row in rows}) <= 1:
    return np.asarray(partition)  # Equal rows (or none): the fixed-size form, validated as such.
  for k, row in enumerate(rows):
    if row.ndim != 1 or row.size < 1 or not np.issubdtype(row.dtype, np.integer):
      raise ValueError(f"ragged partition rows must be non-empty 1-D int arrays; row {k} has shape "
                       f"{row.shape} and dtype {row.dtype}")
  return [row.astype(np.int64) for row in rows]
