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


@pytest.fixture
def ragged_client_data(synthetic_train):
  p = data.dirichlet_label_split(synthetic_train.labels, num_clients=6, alpha=0.1, seed=0)
  assert len({row.size for row in p}) > 1  # Really ragged.
  return PartitionedClientData(synthetic_train, p)


def test_ragged_partition_gives_each_client_its_own_rows(ragged_client_data, synthetic_train):
  cd = ragged_client_data
  assert cd.num_clients == 6 and cd.client_ids == [str(i) for i in range(6)] and cd.is_ragged
  np.testing.assert_array_equal(cd.client_sizes, [rows.size for rows in cd.partition])
  assert cd.client_sizes.sum() == len(synthetic_train)
  for cid in cd.client_ids:
    rows = cd.partition[int(cid)]
    examples = list(cd.create_tf_dataset_for_client(cid).as_numpy_iterator())
    assert len(examples) == rows.size
    np.testing.assert_array_equal(np.stack([e["image"] for e in examples]),
                                  synthetic_train.images[rows])
    np.testing.assert_array_equal([e["label"] for e in examples], synthetic_train.labels[rows])
    images, labels = cd.client_arrays(cid)
    np.testing.assert_array_equal(labels, synthetic_train.labels[rows])
  assert cd.element_type_structure["image"] == tf.TensorSpec((28, 28, 1), tf.uint8)
  with pytest.raises(ValueError, match="unequal sizes"):
    cd.samples_per_client  # pylint: disable=pointless-statement


def test_ragged_partition_traces_in_tf_function_and_tff(ragged_client_data, synthetic_train):
  cd = ragged_client_data

  @tf.function
  def label_sum_and_count(client_id):
    return cd.serializable_dataset_fn(client_id).reduce(
        (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
        lambda acc, ex: (acc[0] + ex["label"], acc[1] + 1))
  for k in range(cd.num_clients):
    total, count = label_sum_and_count(tf.constant(str(k)))
    rows = cd.partition[k]
    assert (int(total), int(count)) == (synthetic_train.labels[rows].sum(), rows.size)
  last = cd.num_clients - 1
  labels = [int(e["label"]) for e in cd.dataset_computation(str(last))]
  np.testing.assert_array_equal(labels, synthetic_train.labels[cd.partition[last]])


def test_equal_length_list_is_the_fixed_size_form(synthetic_train):
  cd = PartitionedClientData(synthetic_train, [np.array([0, 1]), np.array([2, 3])])
  assert not cd.is_ragged and isinstance(cd.partition, np.ndarray)
  assert cd.partition.shape == (2, 2) and cd.samples_per_client == 2
  np.testing.assert_array_equal(cd.client_sizes, [2, 2])


def test_bad_ragged_partitions_raise(synthetic_train):
  with pytest.raises(ValueError, match=r"must lie in \[0, 400\); got \[0, 400\]"):
    PartitionedClientData(synthetic_train, [np.array([0]), np.array([1, 400])])
  with pytest.raises(ValueError, match=r"row 1 has shape \(0,\)"):
    PartitionedClientData(synthetic_train, [np.array([0, 1]), np.array([], np.int64)])
  with pytest.raises(ValueError, match=r"row 0 has shape \(1,\) and dtype float64"):
    PartitionedClientData(synthetic_train, [np.array([0.5]), np.array([1, 2])])
