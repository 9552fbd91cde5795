"""PartitionedClientData: a lazy tff.simulation ClientData over one image array."""

import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import data
from tff_ssl.data.client_data import PartitionedClientData


@pytest.fixture
def client_data(synthetic_train):
  p = data.dirichlet_partition(synthetic_train.labels, num_clients=20, samples_per_client=3,
                               alpha=0, seed=0)
  return PartitionedClientData(synthetic_train, p)


def test_is_a_tff_client_data_with_the_partitions_examples(client_data, synthetic_train):
  assert isinstance(client_data, tff.simulation.datasets.ClientData)
  assert client_data.client_ids[:3] == ["0", "1", "2"] and len(client_data.client_ids) == 20
  rows = client_data.partition[5]
  examples = list(client_data.create_tf_dataset_for_client("5").as_numpy_iterator())
  assert len(examples) == 3
  np.testing.assert_array_equal(np.stack([e["image"] for e in examples]),
                                synthetic_train.images[rows])
  np.testing.assert_array_equal([e["label"] for e in examples], synthetic_train.labels[rows])
  assert client_data.element_type_structure["image"] == tf.TensorSpec((28, 28, 1), tf.uint8)


def test_serializable_dataset_fn_traces_in_tf_function(client_data, synthetic_train):
  @tf.function
  def first_label(client_id):
    return client_data.serializable_dataset_fn(client_id).reduce(
        tf.constant(0, tf.int64), lambda acc, ex: acc + ex["label"])
  want = synthetic_train.labels[client_data.partition[7]].sum()
  assert int(first_label(tf.constant("7"))) == want


def test_dataset_computation_runs_in_tff(client_data, synthetic_train):
  ds = client_data.dataset_computation("3")
  labels = [int(e["label"]) for e in ds]
  np.testing.assert_array_equal(labels, synthetic_train.labels[client_data.partition[3]])


def test_bad_client_ids_and_partitions_raise(client_data, synthetic_train):
  for bad in ("20", "-1", "03", "x"):
    with pytest.raises(ValueError, match="no client"):
      client_data.create_tf_dataset_for_client(bad)
  with pytest.raises(ValueError, match="must lie in"):
    PartitionedClientData(synthetic_train, np.array([[0, 5000]]))


def test_fifty_thousand_one_image_clients_are_cheap():
  images = data.ImageSet(np.zeros((50000, 4, 4, 1), np.uint8), np.repeat(np.arange(10), 5000), 10)
  start = time.perf_counter()
  p = data.dirichlet_partition(images.labels, num_clients=50000, samples_per_client=1, alpha=0,
                               seed=0)
  cd = PartitionedClientData(images, p)
  elapsed = time.perf_counter() - start
  assert len(cd.client_ids) == 50000 and cd.samples_per_client == 1
  print(f"50,000 one-image clients built in {elapsed:.2f} s")  # Reported, not asserted.
