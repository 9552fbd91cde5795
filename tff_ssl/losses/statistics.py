"""Statistics losses: SSL losses that are functions of means over images (DCCO's mechanism, any loss).

A statistics loss is a list of `Term`s and a function of their means. Each term is the mean over the
batch's images of one per-image value: a vector or scalar of the image's encodings (f_i, g_i), or the
outer product of two such vectors (a d x d second-moment matrix). The means of a union of batches are
the size-weighted means of the parts' means, so a federated round can average them (phase 1) and every
client can differentiate through its own share (phase 2): exactly the centralized gradient, whatever
the clients' sizes, one-image clients included (Vemulapalli et al., 2023, Appendix A, for CCO).

An entry gives:
  statistics(f, g) -> {name: mean}        the client's statistics from its projections
  combine(parts, weights) -> {name: mean}  their weighted combination (the union's, with weights N_k)
  loss(stats, count, hparams) -> scalar    the loss from the combined statistics, over `count` images
                                           (the round's total: estimators with 1/(N-1) need it)
and from the terms alone: per-client clipped sums (DP-DCCO's phase-1 record) and per-client statistics
of concatenated clients (the grouped simulation's within-client losses).

  cco       CCO, DCCO's loss (`cco.py`)                          Vemulapalli et al., 2023, eq. 1-2
  vicreg    variance-invariance-covariance (`vicreg.py`)          Bardes et al., 2022, eq. 1-6
  spectral  spectral contrastive loss (`spectral.py`)             HaoChen et al., 2021, eq. 5

Adding one: a module with its terms, loss and fields, and one line in `tff_ssl.losses.STATISTICS`; DCCO, FedAvg
and centralized pretraining then take `--ssl=<name>` (`tff_ssl.ssl` derives the within-client method).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from tff_ssl.privacy import clip as clip_lib


@dataclasses.dataclass(frozen=True)
class Term:
  """One statistic: the mean over images of `of(f, g)` ([N] or [N, d] per-image values), or, with
  `outer`, of the outer products of(f, g)_i outer(f, g)_i^T ([d, d])."""

  name: str
  of: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
  outer: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None

  def __post_init__(self):
    # Plain TensorFlow: autograph has nothing to convert, and cannot parse several lambdas a line.
    object.__setattr__(self, "of", tf.autograph.experimental.do_not_convert(self.of))
    if self.outer is not None:
      object.__setattr__(self, "outer", tf.autograph.experimental.do_not_convert(self.outer))

  def shape(self, dim: int) -> list[int]:
    """The statistic's shape for encodings of dimension `dim` (every per-image vector has `dim`
    entries, a per-image scalar none)."""
    probe = self.of(tf.zeros([1, dim]), tf.zeros([1, dim]))
    left = probe.shape[1:].as_list()
    return left + [dim] if self.outer is not None else left

  def mean(self, f: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    a = self.of(f, g)
    if self.outer is None:
      return tf.reduce_mean(a, axis=0)
    n = tf.cast(tf.shape(a)[0], a.dtype)
    return tf.matmul(a, self.outer(f, g), transpose_a=True) / n

  def per_client_mean(self, f, g, segments, sizes) -> tf.Tensor:
    """[K, ...] the term's mean over each client's rows (rows concatenated client by client)."""
    a = self.of(f, g)
    count = tf.shape(sizes)[0]
    n = tf.cast(sizes, a.dtype)
    if self.outer is None:
      total = tf.math.unsorted_segment_sum(a, segments, count)
      return total / tf.reshape(n, [-1] + [1] * (a.shape.rank - 1))
    onehot = tf.one_hot(segments, count, dtype=a.dtype)  # [N, K]
    b = self.outer(f, g)
    # sum_{i in k} a_i b_i^T for every k at once: [K, d, d].
    total = tf.einsum("nk,ni,nj->kij", onehot, a, b)
    return total / n[:, None, None]

  def client_sums(self, f, g, rows: "ClientRows") -> tuple[tf.Tensor, Callable]:
    """(||sum_{i in k} term_i||^2 for each client k [K], the weighted sum of the term over all rows
    with per-row weights w [N, 1]). `rows`: each row's client. An outer term's norm comes from the
    rows' dot products within each client (`ClientRows.pair_sums`):
    ||sum_{i in k} a_i b_i^T||^2 = sum_{i,j in k} (a_i . a_j)(b_i . b_j); no client's d x d matrix is
    formed."""
    a = self.of(f, g)
    if self.outer is None:
      a2 = tf.reshape(a, [tf.shape(a)[0], -1])
      square = tf.reduce_sum(tf.square(rows.segment_sum(a2)), axis=1)
      return square, lambda w: tf.reduce_sum(tf.reshape(w, [-1] + [1] * (a.shape.rank - 1)) * a,
                                             axis=0)
    b = self.outer(f, g)
    return (tf.maximum(rows.pair_sums(a, b), 0.0),
            lambda w: tf.matmul(w * a, b, transpose_a=True))


class ClientRows:
  """The rows of a batch by client (`segments` [N]: each row's client in [0, count), any order):
  per-client sums, and per-client sums over pairs of rows of one client, in O(sum_k N_k^2 d)
  rather than the O(N^2 d) of the batch's Gram matrices (one-image clients: O(N d)).

  `pairs`: enumerate the within-client pairs (i, j) (sum_k N_k^2 of them), or mask the batch's
  [N, N] Gram matrices to one client's rows. None: pairs where their gathered rows take no more
  memory than an [N, N] matrix (sum_k N_k^2 d <= N^2), the Gram matrices otherwise (a batch of
  few large clients)."""

  def __init__(self, segments, count, dim: int, pairs: bool | None = None):
    self.segments = tf.convert_to_tensor(segments, tf.int32)
    self.count = count
    n = tf.size(self.segments)
    sizes = tf.math.unsorted_segment_sum(tf.ones_like(self.segments), self.segments, count)
    row_sizes = tf.gather(sizes, self.segments)  # Each row's client's size.
    total = tf.reduce_sum(tf.cast(row_sizes, tf.int64))
    n64 = tf.cast(n, tf.int64)
    self.use_pairs = (tf.constant(bool(pairs)) if pairs is not None
                      else total * max(int(dim), 1) <= n64 * n64)
    self._sizes = sizes

  def segment_sum(self, x: tf.Tensor) -> tf.Tensor:
    """[K, ...] each client's sum of its rows of `x` [N, ...]."""
    return tf.math.unsorted_segment_sum(x, self.segments, self.count)

  def _pair_indices(self):
    """(i, j, client) of every ordered pair of rows of one client (a row with itself included)."""
    order = tf.argsort(self.segments, stable=True)  # Rows client by client.
    ordered = tf.gather(self.segments, order)
    starts = tf.cumsum(self._sizes, exclusive=True)
    repeat = tf.gather(self._sizes, ordered)
    left = tf.repeat(tf.range(tf.size(ordered)), repeat)  # Positions in `order`.
    offset = tf.range(tf.reduce_sum(repeat)) - tf.repeat(tf.cumsum(repeat, exclusive=True), repeat)
    right = tf.gather(starts, tf.gather(ordered, left)) + offset
    return tf.gather(order, left), tf.gather(order, right), tf.gather(ordered, left)

  def pair_sums(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """[K]: sum_{i,j in k} (a_i . a_j)(b_i . b_j) for each client k (a, b [N, d])."""
    def by_pairs():
      i, j, client = self._pair_indices()
      dots = (tf.reduce_sum(tf.gather(a, i) * tf.gather(a, j), 1)
              * tf.reduce_sum(tf.gather(b, i) * tf.gather(b, j), 1))
      return tf.math.unsorted_segment_sum(dots, client, self.count)

    def by_gram():
      same = tf.cast(tf.equal(self.segments[:, None], self.segments[None, :]), a.dtype)
      pair = tf.matmul(a, a, transpose_b=True) * tf.matmul(b, b, transpose_b=True) * same
      return self.segment_sum(tf.reduce_sum(pair, axis=1))

    return tf.cond(self.use_pairs, by_pairs, by_gram)


Statistics = Mapping[str, tf.Tensor]


@dataclasses.dataclass(frozen=True)
class StatisticsLoss:
  """A loss of means over images (module doc). `loss(stats, count, hparams)`: `stats` maps the
  terms' names to their means (broadcasting over leading client dimensions: [K, ...] and count [K]),
  `count` the images they are over, `hparams` any object with the fields it declares (`fields`).
  `eps` the default variance floor (`loss`'s keyword, which DP-DCCO raises by the noise's scale)."""

  name: str
  terms: tuple[Term, ...]
  loss_fn: Callable[..., tf.Tensor]
  fields: tuple[Any, ...] = ()  # Its hyperparameters (`tff_ssl.config_fields.Field`s), read by name.
  eps: float = 0.0
  min_samples: int = 2  # Fewest images a within-batch loss is defined for (1/(N-1), correlations).
  summary: str = ""
  # The largest L2 norm one image's statistics (its per-image terms, outer products as matrices) can
  # have when both encodings are unit vectors (`--projector_output=unit`), attained by some pair: a
  # statistics clip chosen without data (DP-DCCO's `--dp_statistics_clip_at_bound`). None: unbounded.
  unit_bound: float | None = None
  # Its own within-client forms, where it has them (CCO: the correlation matrix, the Gram form): the
  # within-client SSL method derived from it (`tff_ssl.ssl.statistics`) uses them instead of
  # `batch_loss` / `per_client_loss`. batch_form(f, g, hparams); per_client_form(f, g, sizes, hparams).
  batch_form: Callable[..., tf.Tensor] | None = None
  per_client_form: Callable[..., tf.Tensor] | None = None

  @property
  def hparams(self) -> tuple[str, ...]:
    """The names of its hyperparameters (its `fields`)."""
    return tuple(f.name for f in self.fields)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(t.name for t in self.terms)

  def shapes(self, dim: int) -> dict[str, list[int]]:
    return {t.name: t.shape(dim) for t in self.terms}

  def statistics(self, f, g) -> collections.OrderedDict:
    """The batch's means of the terms ({name: tensor}, in the terms' order)."""
    f = tf.convert_to_tensor(f)
    g = tf.convert_to_tensor(g, dtype=f.dtype)
    check_encodings(f, g)
    return collections.OrderedDict((t.name, t.mean(f, g)) for t in self.terms)

  def combine(self, parts: Sequence[Statistics], weights: Sequence[float]) -> collections.OrderedDict:
    """The weighted mean of several batches' statistics: the union's when the weights are N_k."""
    if len(parts) != len(weights) or not parts:
      raise ValueError(f"need one weight per statistics; got {len(parts)} statistics, "
                       f"{len(weights)} weights")
    w = tf.convert_to_tensor(weights, dtype=parts[0][self.terms[0].name].dtype)
    w = w / tf.reduce_sum(w)
    return collections.OrderedDict(
        (name, tf.add_n([w[k] * p[name] for k, p in enumerate(parts)])) for name in self.names)

  def loss(self, stats: Statistics, count, hparams: Any = None, eps: float | None = None):
    """The loss from statistics over `count` images."""
    stats = as_statistics(self, stats)
    dtype = stats[self.terms[0].name].dtype
    return self.loss_fn(stats, as_dtype(count, dtype), hparams,
                        self.eps if eps is None else eps)

  def batch_loss(self, f, g, hparams: Any = None):
    """The within-batch loss of encodings `f`, `g` ([N, d]), N >= `min_samples`."""
    f = check_batch(tf.convert_to_tensor(f), self.name, self.min_samples)
    return self.loss(self.statistics(f, g), tf.shape(f)[0], hparams)

  def per_client_loss(self, f, g, sizes, hparams: Any = None):
    """[K] within-client losses of clients whose rows of `f`, `g` (concatenated client by client)
    have the given sizes: each client's statistics over its own rows, one batched pass."""
    f = tf.convert_to_tensor(f)
    g = tf.convert_to_tensor(g, dtype=f.dtype)
    sizes = tf.convert_to_tensor(sizes, tf.int32)
    segments = tf.repeat(tf.range(tf.shape(sizes)[0]), sizes)
    stats = collections.OrderedDict(
        (t.name, t.per_client_mean(f, g, segments, sizes)) for t in self.terms)
    return self.loss(stats, sizes, hparams)

  def clipped_sum(self, f, g, segments, count, clip, pairs: bool | None = None
                  ) -> tuple[collections.OrderedDict, tf.Tensor]:
    """sum_k min(1, clip / ||S_k||) S_k over the clients k of a batch, where S_k = N_k <>_k is client
    k's sum of the per-image terms and ||S_k|| the L2 norm of all of them together (DP-DCCO's
    phase-1 record, clipped per client); also the clients' norms [count]. `segments` [N]: each
    row's client in [0, count). `pairs`: how outer terms' norms are summed (`ClientRows`)."""
    f = tf.convert_to_tensor(f)
    g = tf.convert_to_tensor(g, dtype=f.dtype)
    check_encodings(f, g)
    rows = ClientRows(segments, count, f.shape[1] or 1, pairs)
    parts = [t.client_sums(f, g, rows) for t in self.terms]
    total = parts[0][0]
    for square, _ in parts[1:]:  # In the terms' order (CCO's numbers as they were).
      total = total + square
    norms = tf.sqrt(total)
    w = tf.gather(clip_lib.factors(norms, clip), segments)[:, None]
    return collections.OrderedDict(
        (t.name, weighted(w)) for t, (_, weighted) in zip(self.terms, parts)), norms


def as_dtype(x, dtype) -> tf.Tensor:
  """`x` (a tensor, or a Python number taken at full precision) as a tensor of `dtype`."""
  return tf.cast(tf.convert_to_tensor(x, dtype_hint=dtype), dtype)


def combined(local: Statistics, aggregate: Statistics) -> collections.OrderedDict:
  """<>_C = <>_k + stop_gradient(<>_A - <>_k): the aggregate's value, the local gradient (DCCO eq. 3)."""
  return collections.OrderedDict(
      (name, x + tf.stop_gradient(tf.cast(aggregate[name], x.dtype) - x))
      for name, x in local.items())


def as_statistics(entry: StatisticsLoss, struct) -> collections.OrderedDict:
  """`struct` (a mapping, an attribute struct, or a list in the terms' order) as {name: tensor}."""
  if isinstance(struct, Mapping):
    return collections.OrderedDict((n, struct[n]) for n in entry.names)
  if isinstance(struct, (list, tuple)) and not hasattr(struct, "_fields"):
    return collections.OrderedDict(zip(entry.names, struct))
  return collections.OrderedDict((n, getattr(struct, n)) for n in entry.names)


def check_encodings(f: tf.Tensor, g: tf.Tensor) -> None:
  if f.shape.rank != 2 or g.shape.rank != 2:
    raise ValueError(f"encodings must be rank-2 [batch, dim]; got shapes {f.shape} and {g.shape}")
  if f.shape[1] is not None and g.shape[1] is not None and f.shape[1] != g.shape[1]:
    raise ValueError(
        f"encodings F and G must have the same dimension; got {f.shape[1]} and {g.shape[1]}")


def check_batch(x: tf.Tensor, loss_name: str, fewest: int = 2) -> tf.Tensor:
  """`x`, checked to hold >= `fewest` rows: statically when the shape is known, else when computed."""
  message = (f"a within-batch {loss_name} loss needs at least {fewest} samples per batch; got {{}}. "
             "Clients with a single sample need DCCO (statistics aggregated across clients) instead")
  n = x.shape[0]
  if n is not None:
    if n < fewest:
      raise ValueError(message.format(n))
    return x
  check = tf.debugging.assert_greater_equal(tf.shape(x)[0], fewest, message=message.format("fewer"))
  with tf.control_dependencies([check] if check is not None else []):
    return tf.identity(x)
