"""Federated clients over one in-memory image set, as a `tff.simulation.datasets.ClientData`.

Clients are rows of a partition (`tff_ssl.data.partition`): each holds indices into the shared image
array, and its `tf.data.Dataset` gathers those rows when it is built. Nothing is copied per client, so
50,000 one-image clients cost one small index array.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.data.sources import ImageSet


class PartitionedClientData(tff.simulation.datasets.ClientData):
  """Clients `"0"`, `"1"`, ... whose examples are `{"image": uint8 [H, W, C], "label": int64}`."""

  def __init__(self, images: ImageSet, partition: np.ndarray):
    """
    Args:
      images: the shared image set.
      partition: int array [num_clients, samples_per_client] of indices into `images`.
    """
    super().__init__()
    partition = np.asarray(partition)
    if partition.ndim != 2 or partition.shape[0] < 1 or partition.shape[1] < 1:
      raise ValueError(f"partition must be a non-empty [num_clients, samples_per_client] array; got "
                       f"shape {partition.shape}")
    if partition.min() < 0 or partition.max() >= len(images):
      raise ValueError(f"partition indices must lie in [0, {len(images)}); got "
                       f"[{partition.min()}, {partition.max()}]")
    self._images = images
    self._partition = partition.astype(np.int64)
    self._client_ids = [str(i) for i in range(partition.shape[0])]
    self._tensors = None  # Built on first use: (images, labels, partition) as tf constants.

  @property
  def image_set(self) -> ImageSet:
    return self._images

  @property
  def partition(self) -> np.ndarray:
    return self._partition

  @property
  def client_ids(self) -> list[str]:
    return self._client_ids

  @property
  def num_clients(self) -> int:
    return self._partition.shape[0]

  @property
  def samples_per_client(self) -> int:
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
    if self._tensors is None:
      self._tensors = (tf.constant(self._images.images), tf.constant(self._images.labels),
                       tf.constant(self._partition))
    return self._tensors

  @property
  def serializable_dataset_fn(self):
    def dataset_fn(client_id):
      images, labels, partition = self._constants()
      index = tf.strings.to_number(client_id, out_type=tf.int64)
      rows = tf.gather(partition, index)
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
