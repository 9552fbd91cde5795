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


# dirichlet_label_split: ragged clients (L-DAWA's cross-silo split: 10 clients, alpha = 0.1).

SPLIT_LABELS = np.repeat(np.arange(10), 500)  # 10 balanced classes x 500 = 5,000 examples.


def assert_exact_cover(parts, indices):
  """Every index of `indices` in exactly one client, nothing else."""
  assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.sort(indices))


def split_stats(parts, labels=SPLIT_LABELS):
  sizes = np.array([p.size for p in parts])
  hist = label_hist(parts, labels)
  return sizes, hist, hist.max(axis=1) / sizes


def test_label_split_uses_every_index_exactly_once():
  for alpha in (0.1, 1.0, 1000.0):
    parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=alpha, seed=3)
    assert len(parts) == 10
    assert_exact_cover(parts, np.arange(SPLIT_LABELS.size))


def test_label_split_is_deterministic_in_the_seed():
  kw = dict(num_clients=10, alpha=0.1)
  a = data.dirichlet_label_split(SPLIT_LABELS, seed=5, **kw)
  b = data.dirichlet_label_split(SPLIT_LABELS, seed=5, **kw)
  assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
  c = data.dirichlet_label_split(SPLIT_LABELS, seed=6, **kw)
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_label_split_within_client_order_is_shuffled():
  # Labels are sorted by class, so sorted indices would group a client's data by class.
  parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=1000, seed=0)
  assert not any(np.array_equal(p, np.sort(p)) for p in parts)


@pytest.mark.parametrize("seed", range(5))
def test_small_alpha_gives_unequal_clients_dominated_by_few_classes(seed):
  parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=0.1, seed=seed)
  sizes, _, top_share = split_stats(parts)
  # Over 300 seeds: size ratio >= 3.1 and mean top-class share >= 0.47 (0.60 on average); IID ~0.1.
  assert sizes.max() / sizes.min() > 2
  assert top_share.mean() > 0.4


def test_small_alpha_top_class_share_averages_above_half():
  shares = [split_stats(data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=0.1,
                                                   seed=seed))[2].mean() for seed in range(5)]
  assert np.mean(shares) > 0.5  # 0.61 for these seeds.


@pytest.mark.parametrize("seed", range(3))
def test_large_alpha_gives_near_iid_near_equal_clients(seed):
  parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=1000, seed=seed)
  sizes, hist, top_share = split_stats(parts)
  # Each p_ck = 0.1 +- 0.003 (std), so each count is 50 +- 1.5 and each size 500 +- 5 (observed
  # worst over 50 seeds: share off by 0.009, size off by 14).
  assert np.abs(sizes - 500).max() <= 40
  assert np.abs(hist / sizes[:, None] - 0.1).max() < 0.03
  assert top_share.mean() < 0.15


def test_each_class_is_split_exactly():
  parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=7, alpha=0.5, seed=2)
  np.testing.assert_array_equal(label_hist(parts, SPLIT_LABELS).sum(axis=0), np.full(10, 500))


def test_min_samples_per_client_is_respected():
  # 20 clients at alpha 0.1: single draws often leave a client nearly empty, so the minimum binds.
  loose = []
  for seed in range(5):
    parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=20, alpha=0.1, seed=seed,
                                       min_samples_per_client=25)
    assert min(p.size for p in parts) >= 25
    assert_exact_cover(parts, np.arange(SPLIT_LABELS.size))
    loose.append(min(p.size for p in data.dirichlet_label_split(
        SPLIT_LABELS, num_clients=20, alpha=0.1, seed=seed, min_samples_per_client=1)))
  assert min(loose) < 25  # Some of these draws violate the minimum without the re-draw.


def test_num_samples_splits_a_random_subset():
  parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=0.1, seed=0,
                                     num_samples=1234)
  flat = np.concatenate(parts)
  assert flat.size == 1234 and np.unique(flat).size == 1234
  assert flat.min() >= 0 and flat.max() < SPLIT_LABELS.size
  # A random subset holds all 10 classes; the first 1,234 indices would hold only 3.
  assert (label_hist([flat], SPLIT_LABELS) > 0).sum() == 10
  again = data.dirichlet_label_split(SPLIT_LABELS, num_clients=10, alpha=0.1, seed=0,
                                     num_samples=1234)
  assert all(np.array_equal(x, y) for x, y in zip(parts, again))
  whole = data.dirichlet_label_split(SPLIT_LABELS, num_clients=3, alpha=1.0, seed=0,
                                     num_samples=SPLIT_LABELS.size)
  assert_exact_cover(whole, np.arange(SPLIT_LABELS.size))


def test_one_client_gets_everything():
  parts = data.dirichlet_label_split(SPLIT_LABELS, num_clients=1, alpha=0.1, seed=0)
  assert len(parts) == 1
  assert_exact_cover(parts, np.arange(SPLIT_LABELS.size))


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_clients=10, alpha=0), r"^alpha must be > 0 .*; got 0$"),
    (dict(num_clients=10, alpha=-0.5), r"^alpha must be > 0 .*; got -0.5$"),
    (dict(num_clients=10, alpha=float("nan")), r"^alpha must be > 0 .*; got nan$"),
    (dict(num_clients=0, alpha=1.0), r"^num_clients must be >= 1; got 0$"),
    (dict(num_clients=10, alpha=1.0, min_samples_per_client=0),
     r"^min_samples_per_client must be >= 1 .*; got 0$"),
    (dict(num_clients=10, alpha=1.0, num_samples=5001),
     r"^num_samples must be in \[1, 5000\].*got 5001$"),
    (dict(num_clients=10, alpha=1.0, num_samples=0), r"^num_samples must be in \[1, 5000\].*got 0$"),
    (dict(num_clients=2501, alpha=1.0),
     r"^2501 clients x >= 2 samples = 5002 samples, but the split has only 5000; "),
    (dict(num_clients=10, alpha=1.0, num_samples=19),
     r"^10 clients x >= 2 samples = 20 samples, but the split has only 19; "),
])
def test_label_split_bad_inputs_raise_naming_the_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    data.dirichlet_label_split(SPLIT_LABELS, seed=0, **kwargs)


def test_label_split_gives_up_when_the_minimum_is_unreachable():
  # 2 classes at alpha 0.001: each class lands almost whole on one client, so at most ~2 of 10
  # clients are non-empty and no draw can give all 10 two samples.
  labels = np.repeat(np.arange(2), 50)
  with pytest.raises(ValueError, match=r"^dirichlet_label_split\(alpha=0.001, num_clients=10\): no "
                                       r"draw in 1000 .*; use a larger alpha or fewer clients$"):
    data.dirichlet_label_split(labels, num_clients=10, alpha=0.001, seed=0)


def test_label_split_rejects_bad_labels():
  with pytest.raises(ValueError, match="unlabeled"):
    data.dirichlet_label_split(np.full(10, -1), num_clients=2, alpha=1, seed=0)
  with pytest.raises(ValueError, match=r"1-D array; got shape \(2, 5\)"):
    data.dirichlet_label_split(np.zeros((2, 5), np.int64), num_clients=2, alpha=1, seed=0)


@pytest.mark.parametrize("name", sorted(data.PARTITIONS))
def test_every_listed_partition_keeps_its_contract(name):
  # Through the registry, as a run calls it: disjoint clients of indices into the labels, of the
  # declared size (fixed-size partitions), at least the method's minimum, the same for the same seed.
  from tff_ssl.experiment import ExperimentConfig
  labels = np.repeat(np.arange(10), 60)
  # per_image: every image one client (its population is the split's).
  clients, samples = (600, 1) if name == "per_image" else (12, 8)
  config = ExperimentConfig(dataset="synthetic", partition=name, num_clients=clients,
                            samples_per_client=samples, classes_per_client=2, alpha=0.5, seed=3,
                            clients_per_round=4)
  partition = data.PARTITIONS[name]
  parts = list(partition.split(config, labels, 2 if samples > 1 else 1))
  assert len(parts) == clients
  flat = np.concatenate(parts)
  assert flat.size == np.unique(flat).size and flat.min() >= 0 and flat.max() < labels.size
  sizes = {p.size for p in parts}
  assert (sizes == {samples}) if partition.fixed_size else min(sizes) >= 2
  again = partition.split(config, labels, 2)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
