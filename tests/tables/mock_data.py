"""tfds' mock data for the paper-scale table tests: random images, labels cycling over the classes
(seeded; the train and test splits differ)."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

PAPER_SIZE = 32  # CIFAR's images are 32 x 32 x 3.


def mock_cifar(num_classes: int, num_train: int, num_test: int, size: int = PAPER_SIZE):
  """A context in which tfds' `cifar10` / `cifar100` loads `num_train` / `num_test` random
  `size` x `size` x 3 images (smoke runs of a paper config take `size` < 32: every weight of a
  convolutional encoder is the same, its compute is (size / 32)² of the paper's)."""
  def as_dataset(self, split, **kwargs):  # pylint: disable=unused-argument
    n = num_train if str(split).startswith("train") else num_test
    rng = np.random.default_rng(0 if n == num_train else 1)
    return tf.data.Dataset.from_tensor_slices({
        "image": rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
        "label": (np.arange(n) % num_classes).astype(np.int64)})
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)
