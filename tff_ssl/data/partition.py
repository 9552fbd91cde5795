"""Deterministic partitions of a labeled image set into clients.

Two shapes of partition, both holding indices into the dataset with no index appearing twice, and both
drawing every random choice from `np.random.default_rng(seed)`:

Fixed-size: an int64 array `[num_clients, samples_per_client]`.

  dirichlet_partition        each client's label mix ~ Dir(alpha * 1): alpha = 0 gives clients of one
                             class (DCCO's non-IID setting), large alpha (1000) near-IID clients.
  classes_per_client_partition
                             each client holds k distinct classes in near-equal shares (FedEMA's
                             "2 of 10 / 20 of 100 classes" setting).
  iid_partition              uniformly random clients (works on unlabeled splits).
  per_image_partition        every image of the split one client (one-image users, the DP scaling
                             table's population).

Ragged: a list of `num_clients` 1-D int64 arrays of unequal lengths.

  dirichlet_label_split      each class is split over the clients by proportions ~ Dir(alpha * 1)
                             (Hsu et al. 2019; Flower's DirichletPartitioner), so clients differ in
                             size as well as label mix (L-DAWA's cross-silo setting: 10 clients,
                             alpha = 0.1). Every sample (of an optional random subset) is used.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np

from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
PARTITION = Field("partition", "dirichlet", "dirichlet: num_clients x samples_per_client, labels "
                  "~ Dir(alpha); dirichlet_split: every class split over the clients by "
                  "Dir(alpha) (unequal sizes, the L-DAWA paper's); classes: num_clients x "
                  "samples_per_client, classes_per_client classes each (FedEMA's); per_image: "
                  "every training image one client (num_clients = the split's size).",
                  choices=lambda: PARTITIONS)
SPLIT_SAMPLES = Field("split_samples", 0, "dirichlet_split: split this many random training "
                      "images (0: all).", lower=0, note="0: the whole split")
CLASSES_PER_CLIENT = Field("classes_per_client", 2, "classes partition: classes each client "
                           "holds.", lower=1)


# The partitions' config fields (their one check).
NUM_CLIENTS = Field("num_clients", 6000, "Clients in the partition of the train split.", lower=1)
SAMPLES_PER_CLIENT = Field("samples_per_client", 1, "Images per client (dirichlet and classes "
                           "partitions).", lower=1)
ALPHA = Field("alpha", 0.0, "Dirichlet label concentration: 0 one class per client, 1000 IID.",
              lower=0, note="0: one class per client; 1000: IID")


def _validate(labels: np.ndarray, num_clients: int, samples_per_client: int) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be a 1-D array; got shape {labels.shape}")
  NUM_CLIENTS.check(num_clients)
  SAMPLES_PER_CLIENT.check(samples_per_client)
  if (labels < 0).any():
    raise ValueError("labels must be >= 0 to partition by label; an unlabeled split can only be "
                     "partitioned IID (use a large alpha on a labeled split, or iid_partition)")
  needed = num_clients * samples_per_client
  if needed > labels.shape[0]:
    raise ValueError(f"{num_clients} clients x {samples_per_client} samples = {needed} samples, but "
                     f"the dataset has only {labels.shape[0]}; lower num_clients or "
                     f"samples_per_client")
  return labels


def _class_pools(labels: np.ndarray, rng: np.random.Generator) -> list[list[int]]:
  """Per class, its indices in a random order (popped from the end)."""
  num_classes = int(labels.max()) + 1
  return [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(num_classes)]


def _take(pools: list[list[int]], counts: np.ndarray) -> list[int]:
  out = []
  for c, k in enumerate(counts):
    for _ in range(int(k)):
      out.append(pools[c].pop())
  return out


def _fit_counts(counts: np.ndarray, remaining: np.ndarray, weights: np.ndarray,
                rng: np.random.Generator) -> np.ndarray:
  """Moves counts beyond a class's remaining samples to classes that still have some.

  The excess goes preferentially to classes the client already favours (`weights`), else to classes
  in proportion to what they have left.
  """
  counts = counts.copy()
  excess = int(np.maximum(counts - remaining, 0).sum())
  counts = np.minimum(counts, remaining)
  while excess > 0:
    room = remaining - counts
    p = np.where(room > 0, weights, 0.0)
    if p.sum() <= 0:
      p = room.astype(np.float64)
    p = p / p.sum()
    c = rng.choice(len(p), p=p)
    counts[c] += 1
    excess -= 1
  return counts


def dirichlet_partition(labels: np.ndarray, *, num_clients: int, samples_per_client: int,
                        alpha: float, seed: int) -> np.ndarray:
  """Clients whose label proportions are drawn from a symmetric Dirichlet(alpha).

  alpha = 0 is the limit in which each client holds a single class: the class is drawn in proportion
  to the samples it has left, among classes that can still fill a whole client. Only when no class can
  (the classes' leftovers are all smaller than a client), a client takes several classes; that is
  logged.

  Args:
    labels: int array [N] of class labels >= 0.
    num_clients: number of clients (>= 1).
    samples_per_client: samples each client holds (>= 1).
    alpha: Dirichlet concentration (>= 0).
    seed: seed of every random choice.

  Returns:
    int64 array [num_clients, samples_per_client] of distinct indices into `labels`.

  Raises:
    ValueError: alpha < 0, no clients, or more samples requested than the dataset has.
  """
  ALPHA.check(alpha)  # Also rejects NaN.
  labels = _validate(labels, num_clients, samples_per_client)
  rng = np.random.default_rng(seed)
  pools = _class_pools(labels, rng)
  num_classes = len(pools)
  clients = np.empty((num_clients, samples_per_client), np.int64)
  mixed = 0
  for k in range(num_clients):
    remaining = np.array([len(p) for p in pools])
    if alpha == 0:
      fits = remaining >= samples_per_client
      if fits.any():
        p = np.where(fits, remaining, 0) / np.where(fits, remaining, 0).sum()
        counts = np.zeros(num_classes, np.int64)
        counts[rng.choice(num_classes, p=p)] = samples_per_client
      else:
        mixed += 1
        weights = remaining.astype(np.float64)
        counts = _fill(np.zeros(num_classes, np.int64), samples_per_client, remaining, weights, rng)
    else:
      proportions = rng.dirichlet(np.full(num_classes, float(alpha)))
      proportions = np.nan_to_num(proportions, nan=0.0)
      if proportions.sum() <= 0:  # Underflow at tiny alpha: all mass on one class.
        proportions = np.eye(num_classes)[rng.integers(num_classes)]
      proportions = proportions / proportions.sum()
      counts = rng.multinomial(samples_per_client, proportions)
      counts = _fit_counts(counts, remaining, proportions + 1e-12, rng)
    clients[k] = rng.permutation(_take(pools, counts))
  if mixed:
    logging.info("dirichlet_partition(alpha=0): %d of %d clients hold more than one class, because "
                 "no single class had %d samples left", mixed, num_clients, samples_per_client)
  return clients


def _fill(counts, total, remaining, weights, rng):
  """Adds samples to `counts` until it sums to `total`, respecting `remaining`."""
  counts = counts.copy()
  while counts.sum() < total:
    room = remaining - counts
    p = np.where(room > 0, weights, 0.0)
    c = rng.choice(len(p), p=p / p.sum())
    counts[c] += 1
  return counts


def classes_per_client_partition(labels: np.ndarray, *, num_clients: int, samples_per_client: int,
                                 classes_per_client: int, seed: int) -> np.ndarray:
  """Clients holding `classes_per_client` distinct classes each, in near-equal shares.

  Classes are drawn without replacement in proportion to the samples they have left, among those that
  can still supply their share.

  Raises:
    ValueError: classes_per_client outside [1, num_classes] or above samples_per_client, no clients,
      more samples than the dataset has, or classes exhausted before every client is filled.
  """
  labels = _validate(labels, num_clients, samples_per_client)
  num_classes = int(labels.max()) + 1
  if not 1 <= classes_per_client <= num_classes:
    raise ValueError(f"classes_per_client must be in [1, {num_classes}] (the dataset's classes); "
                     f"got {classes_per_client}")
  if classes_per_client > samples_per_client:
    raise ValueError(f"classes_per_client ({classes_per_client}) cannot exceed samples_per_client "
                     f"({samples_per_client}): each class needs at least one sample")
  rng = np.random.default_rng(seed)
  pools = _class_pools(labels, rng)
  base, extra = divmod(samples_per_client, classes_per_client)
  shares = np.array([base + 1] * extra + [base] * (classes_per_client - extra))
  clients = np.empty((num_clients, samples_per_client), np.int64)
  for k in range(num_clients):
    remaining = np.array([len(p) for p in pools])
    counts = np.zeros(num_classes, np.int64)
    for share in shares:
      ok = (remaining >= share) & (counts == 0)
      if not ok.any():
        raise ValueError(
            f"cannot give client {k} of {num_clients} {classes_per_client} classes of ~{base} "
            f"samples each: the classes are used up; lower num_clients or samples_per_client")
      p = np.where(ok, remaining, 0).astype(np.float64)
      c = rng.choice(num_classes, p=p / p.sum())
      counts[c] = share
    clients[k] = rng.permutation(_take(pools, counts))
  return clients


def iid_partition(num_examples: int, *, num_clients: int, samples_per_client: int,
                  seed: int) -> np.ndarray:
  """Clients of uniformly random, disjoint samples (works on unlabeled splits)."""
  _validate(np.zeros(num_examples, np.int64), num_clients, samples_per_client)
  rng = np.random.default_rng(seed)
  idx = rng.permutation(num_examples)[:num_clients * samples_per_client]
  return idx.reshape(num_clients, samples_per_client).astype(np.int64)


def per_image_partition(num_examples: int, *, num_clients: int, seed: int) -> np.ndarray:
  """Every image of the split is one client (a user of one image, where user-level DP is
  example-level DP): [num_examples, 1], the images in a seeded random order. `num_clients` must be
  the split's size, so that the population a DP run accounts with is the one it trains on."""
  if num_clients != num_examples:
    raise ValueError(f"partition per_image makes one client of each of the split's {num_examples} "
                     f"images; got num_clients={num_clients}: set --num_clients={num_examples}")
  return np.random.default_rng(seed).permutation(num_examples).astype(np.int64)[:, None]


def _check_per_image(config) -> None:
  if config.samples_per_client != 1:
    raise ValueError(f"partition per_image gives every client one image; got "
                     f"samples_per_client={config.samples_per_client}: set --samples_per_client=1")


# Re-draws allowed before dirichlet_label_split gives up on `min_samples_per_client`.
_MAX_SPLIT_ATTEMPTS = 1000


def _largest_remainder(proportions: np.ndarray, total: int) -> np.ndarray:
  """Integer counts summing to `total`, each the floor or ceiling of `proportions * total`.

  The floors are topped up by one, largest fractional part first (ties to the lower index), so that
  the split is exact and as close to `proportions * total` as integers allow.
  """
  exact = proportions * total
  counts = np.floor(exact).astype(np.int64)
  short = total - int(counts.sum())
  if short > 0:
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
  return counts


def dirichlet_label_split(labels: np.ndarray, *, num_clients: int, alpha: float, seed: int,
                          min_samples_per_client: int = 2,
                          num_samples: int | None = None) -> list[np.ndarray]:
  """Splits every class over the clients by Dirichlet proportions; clients differ in size.

  For each class c with n_c samples, proportions p_c ~ Dir(alpha * 1_K) over the K clients are drawn
  and client k receives round(p_c,k * n_c) of class c's samples (largest-remainder rounding, so the
  n_c samples are split exactly). Small alpha gives clients dominated by a few classes and of very
  unequal sizes; large alpha gives near-IID, near-equal clients. The whole draw is repeated, with the same
  generator, until every client has at least `min_samples_per_client` samples.

  Args:
    labels: int array [N] of class labels >= 0.
    num_clients: number of clients K (>= 1).
    alpha: Dirichlet concentration (> 0; Dir(0) is undefined).
    seed: seed of every random choice.
    min_samples_per_client: fewest samples a client may hold (>= 1; the default 2 is what a
      within-client SSL loss needs).
    num_samples: if given, only a uniformly random subset of this many samples (1 <= num_samples <=
      N) is split, e.g. for mini-scale experiments; None splits all N.

  Returns:
    `num_clients` int64 arrays of indices into `labels`, in a seeded random order within each client
    (as the fixed-size partitions are, so a client's data is not grouped by class). Together they hold
    every index of the (sub)set exactly once.

  Raises:
    ValueError: bad labels, alpha <= 0, no clients, num_samples outside [1, N], fewer samples than
      num_clients * min_samples_per_client, or no draw meeting the minimum within
      `_MAX_SPLIT_ATTEMPTS` attempts.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be a 1-D array; got shape {labels.shape}")
  if not 0 < alpha < np.inf:  # Also rejects NaN.
    raise ValueError(f"alpha must be > 0 for dirichlet_label_split (Dir(0) is undefined; use e.g. "
                     f"0.1 for strong skew, or dirichlet_partition for alpha=0); got {alpha}")
  if num_clients < 1:
    raise ValueError(f"num_clients must be >= 1; got {num_clients}")
  if min_samples_per_client < 1:
    raise ValueError(f"min_samples_per_client must be >= 1 (clients cannot be empty); got "
                     f"{min_samples_per_client}")
  if (labels < 0).any():
    raise ValueError("labels must be >= 0 to partition by label; an unlabeled split can only be "
                     "partitioned IID (use iid_partition)")
  if num_samples is not None and not (isinstance(num_samples, (int, np.integer))
                                     and 1 <= num_samples <= labels.shape[0]):
    raise ValueError(f"num_samples must be in [1, {labels.shape[0]}] (the dataset's size) or None; "
                     f"got {num_samples}")
  rng = np.random.default_rng(seed)
  if num_samples is None:
    pool = np.arange(labels.shape[0], dtype=np.int64)
  else:
    pool = rng.permutation(labels.shape[0])[:num_samples].astype(np.int64)
  needed = num_clients * min_samples_per_client
  if needed > pool.size:  # No draw can succeed: fail now rather than after every attempt.
    more = "" if num_samples is None else ", or raise num_samples"
    raise ValueError(f"{num_clients} clients x >= {min_samples_per_client} samples = {needed} "
                     f"samples, but the split has only {pool.size}; lower num_clients or "
                     f"min_samples_per_client{more}")
  # Each class's samples in a random order, fixed across attempts: the attempts redraw only the
  # proportions, which decide where each class is cut.
  pool_labels = labels[pool]
  classes = [rng.permutation(pool[pool_labels == c]) for c in np.unique(pool_labels)]
  for _ in range(_MAX_SPLIT_ATTEMPTS):
    counts = np.empty((len(classes), num_clients), np.int64)
    for i, members in enumerate(classes):
      proportions = np.nan_to_num(rng.dirichlet(np.full(num_clients, float(alpha))), nan=0.0)
      if proportions.sum() <= 0:  # Underflow at tiny alpha: all mass on one client.
        proportions = np.zeros(num_clients)
        proportions[rng.integers(num_clients)] = 1.0
      counts[i] = _largest_remainder(proportions / proportions.sum(), members.size)
    if counts.sum(axis=0).min() >= min_samples_per_client:
      break
  else:
    raise ValueError(f"dirichlet_label_split(alpha={alpha}, num_clients={num_clients}): no draw in "
                     f"{_MAX_SPLIT_ATTEMPTS} gave every client >= {min_samples_per_client} of the "
                     f"{pool.size} samples; use a larger alpha or fewer clients")
  parts = [[] for _ in range(num_clients)]
  for members, class_counts in zip(classes, counts):
    for k, chunk in enumerate(np.split(members, np.cumsum(class_counts)[:-1])):
      parts[k].append(chunk)
  return [rng.permutation(np.concatenate(chunks)).astype(np.int64) for chunks in parts]


@dataclasses.dataclass(frozen=True)
class Partition:
  """A way to split the training images into clients (`--partition`), by name in `PARTITIONS`.

  fields: the config fields it reads (beyond num_clients and seed).
  fixed_size: every client holds `samples_per_client` images (else clients of unequal size).
  split(config, labels, min_samples): the clients, as index rows into `labels` (`min_samples`: the
    fewest images a client of the run's method can train on, for partitions of unequal clients).
  check(config): ValueError naming a bad value of its fields (default: none).
  """

  name: str
  fields: tuple[str, ...]
  fixed_size: bool
  split: Callable[[Any, np.ndarray, int], Any]
  summary: str
  check: Callable[[Any], None] = lambda config: None


def _check_dirichlet_split(config) -> None:
  if not config.alpha > 0:
    raise ValueError(f"the dirichlet_split partition needs alpha > 0; got {config.alpha} (alpha = 0, "
                     f"one class per client, is the dirichlet partition's)")


PARTITIONS: dict[str, Partition] = {p.name: p for p in (
    Partition(
        "dirichlet", ("samples_per_client", "alpha"), True,
        lambda c, labels, need: dirichlet_partition(
            labels, num_clients=c.num_clients, samples_per_client=c.samples_per_client,
            alpha=c.alpha, seed=c.seed),
        "num_clients x samples_per_client, each client's labels ~ Dir(alpha)"),
    Partition(
        "dirichlet_split", ("split_samples", "alpha"), False,
        lambda c, labels, need: dirichlet_label_split(
            labels, num_clients=c.num_clients, alpha=c.alpha, seed=c.seed,
            min_samples_per_client=need, num_samples=c.split_samples or None),
        "every class split over the clients by Dir(alpha) proportions: clients of unequal size, "
        "the L-DAWA paper's; split_samples > 0 splits a random subset of that many images",
        check=_check_dirichlet_split),
    Partition(
        "classes", ("samples_per_client", "classes_per_client"), True,
        lambda c, labels, need: classes_per_client_partition(
            labels, num_clients=c.num_clients, samples_per_client=c.samples_per_client,
            classes_per_client=c.classes_per_client, seed=c.seed),
        "num_clients x samples_per_client, each client holding classes_per_client classes in equal "
        "shares: FedEMA's"),
    Partition(
        "per_image", ("samples_per_client",), True,
        lambda c, labels, need: per_image_partition(len(labels), num_clients=c.num_clients,
                                                    seed=c.seed),
        "every training image its own client (num_clients = the split's size, samples_per_client "
        "= 1): 60,000 one-image users of Fashion-MNIST, for user-level DP", check=_check_per_image),
)}


def get(name: str) -> Partition:
  """The partition `name`; ValueError listing the registered names otherwise."""
  if name not in PARTITIONS:
    raise ValueError(f"unknown partition {name!r}; choose one of {sorted(PARTITIONS)}")
  return PARTITIONS[name]
