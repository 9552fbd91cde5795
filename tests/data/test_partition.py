"""Client partitions: label skew at both ends of alpha, determinism, disjointness, impossible requests."""

import numpy as np
import pytest

from tff_ssl import data

LABELS = np.repeat(np.arange(10), 1000)  # 10 balanced classes, 10,000 examples.


def label_hist(partition, labels=LABELS, classes=10):
  return np.stack([np.bincount(labels[row], minlength=classes) for row in partition])


def assert_disjoint(partition, n):
  flat = partition.ravel()
  assert np.unique(flat).size == flat.size and flat.min() >= 0 and flat.max() < n


def test_alpha_zero_gives_single_label_clients():
  p = data.dirichlet_partition(LABELS, num_clients=500, samples_per_client=8, alpha=0, seed=0)
  assert p.shape == (500, 8) and p.dtype == np.int64
  assert_disjoint(p, LABELS.size)
  assert ((label_hist(p) > 0).sum(axis=1) == 1).all()


def test_alpha_zero_uses_every_sample_when_classes_divide_evenly():
  p = data.dirichlet_partition(LABELS, num_clients=1250, samples_per_client=8, alpha=0, seed=1)
  assert_disjoint(p, LABELS.size)
  assert p.size == LABELS.size and ((label_hist(p) > 0).sum(axis=1) == 1).all()


def test_large_alpha_gives_near_uniform_label_histograms():
  p = data.dirichlet_partition(LABELS, num_clients=10, samples_per_client=500, alpha=1e4, seed=0)
  fractions = label_hist(p) / 500
  # Multinomial noise alone: std sqrt(0.1 * 0.9 / 500) = 0.013 per entry.
  assert np.abs(fractions - 0.1).max() < 0.07
  skewed = label_hist(data.dirichlet_partition(LABELS, num_clients=10, samples_per_client=500,
                                               alpha=0.1, seed=0)) / 500
  assert np.abs(skewed - 0.1).max() > 0.3


def test_partitions_are_deterministic_in_the_seed():
  kw = dict(num_clients=50, samples_per_client=4, alpha=0.5)
  a = data.dirichlet_partition(LABELS, seed=7, **kw)
  np.testing.assert_array_equal(a, data.dirichlet_partition(LABELS, seed=7, **kw))
  assert not np.array_equal(a, data.dirichlet_partition(LABELS, seed=8, **kw))


def test_fifty_thousand_one_image_clients():
  labels = np.repeat(np.arange(10), 5000)
  p = data.dirichlet_partition(labels, num_clients=50000, samples_per_client=1, alpha=0, seed=0)
  assert p.shape == (50000, 1)
  assert_disjoint(p, labels.size)


def test_class_exhaustion_falls_back_to_mixed_clients_only_when_forced():
  labels = np.repeat(np.arange(3), 10)  # 3 classes x 10; clients of 4: 2 single-class per class.
  p = data.dirichlet_partition(labels, num_clients=7, samples_per_client=4, alpha=0, seed=0)
  assert_disjoint(p, labels.size)
  single = ((label_hist(p, labels, 3) > 0).sum(axis=1) == 1).sum()
  assert single >= 6  # At most the last client must mix classes.


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_clients=100, samples_per_client=101, alpha=1.0), r"100 clients x 101 samples = 10100"),
    (dict(num_clients=10, samples_per_client=1, alpha=-0.5), r"alpha must be >= 0.*got -0.5"),
    (dict(num_clients=0, samples_per_client=1, alpha=1.0), r"num_clients must be >= 1; got 0"),
    (dict(num_clients=1, samples_per_client=0, alpha=1.0), r"samples_per_client must be >= 1; got 0"),
])
def test_impossible_requests_raise_naming_the_numbers(kwargs, match):
  with pytest.raises(ValueError, match=match):
    data.dirichlet_partition(LABELS, seed=0, **kwargs)


def test_classes_per_client():
  p = data.classes_per_client_partition(LABELS, num_clients=100, samples_per_client=10,
                                        classes_per_client=2, seed=0)
  hist = label_hist(p)
  assert ((hist > 0).sum(axis=1) == 2).all()
  assert set(hist[hist > 0].tolist()) == {5}
  assert_disjoint(p, LABELS.size)
  with pytest.raises(ValueError, match=r"classes_per_client must be in \[1, 10\]"):
    data.classes_per_client_partition(LABELS, num_clients=1, samples_per_client=20,
                                      classes_per_client=11, seed=0)
  with pytest.raises(ValueError, match="cannot exceed samples_per_client"):
    data.classes_per_client_partition(LABELS, num_clients=1, samples_per_client=2,
                                      classes_per_client=3, seed=0)


def test_iid_partition_and_unlabeled_labels():
  p = data.iid_partition(100, num_clients=10, samples_per_client=10, seed=0)
  assert_disjoint(p, 100)
  with pytest.raises(ValueError, match="unlabeled"):
    data.dirichlet_partition(np.full(10, -1), num_clients=2, samples_per_client=2, alpha=1, seed=0)
