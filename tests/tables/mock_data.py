"""tfds' mock data for the paper-scale table tests: random 32x32x3 images, labels cycling over the
classes (seeded; the train and test splits differ)."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds


def mock_cifar(num_classes: int, num_train: int, num_test: int):
  """A context in which tfds' `cifar10` / `cifar100` loads `num_train` / `num_test` images."""
  def as_dataset(self, split, **kwargs):  # pylint: disable=unused-argument
    n = num_train if str(split).startswith("train") else num_test
    rng = np.random.default_rng(0 if n == num_train else 1)
    return tf.data.Dataset.from_tensor_slices({
        "image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
        "label": (np.arange(n) % num_classes).astype(np.int64)})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)
