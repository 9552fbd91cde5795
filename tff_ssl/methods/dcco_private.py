"""DP-DCCO (`methods/dcco.py` under --dp): a round's two private releases, the clients' encoding
statistics and then their update, each through `privacy.release` (DP-FedAvg's path) as a phase of
the composer (`composer.Release`).

Phase 1: each real client's N_k <>_k clipped to the statistics clip and summed in its slot, in one
batched pass (`StatisticsLoss.clipped_sum`). Phase 2: each real client's N_k Delta_k clipped to the
update clip; where a client's update is one plain gradient step its record comes from per-image
gradients of the linearized loss in vectorized passes (`clipped_records`), otherwise each client of
a slot trains in turn (the reference). With --dp_augmentations=M every image enters M times and a
client's record is its M-fold sum clipped to M C, then / M.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import data as data_lib
from tff_ssl import losses
from tff_ssl import privacy as privacy_lib
from tff_ssl.config_fields import Field
from tff_ssl.federated import common, composer, grouping
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.methods.dcco_term import StatisticsTerm, client_config, field_of, train_against
from tff_ssl.models import layers
from tff_ssl.privacy import PrivacyConfig
from tff_ssl.privacy import clip as clip_lib
from tff_ssl.privacy import ghost
from tff_ssl.privacy.release import PrivateRelease

DP_STATISTICS_CLIP = Field("dp_statistics_clip", 1.0, "DP-DCCO: each client's L2 clip of its "
                           "encoding statistics' sum (N_k times its statistics).", lower=0,
                           note="0: no clipping, only with noise multiplier 0")
DP_STATISTICS_QUANTILE = Field(
    "dp_statistics_quantile", 0.5, "DP-DCCO with --dp=gaussian_adaptive: the fraction of clients "
    "a round whose statistics the adaptive clip aims to leave unclipped (the update's clip aims "
    "at the median). Near 1 keeps the statistics clip above the norms: a clipped statistics "
    "vector scales its means and second moments together (docs/privacy_scaling_mini.md).",
    lower=0, upper=1, open_lower=True, open_upper=True)
DP_STATISTICS_CLIP_RATE = Field(
    "dp_statistics_clip_rate", 0.2, "DP-DCCO with --dp=gaussian_adaptive: the statistics clip's "
    "geometric learning rate (a round moves it by exp(-rate (unclipped fraction - quantile)); "
    "TFF's 0.2, which the update's clip keeps). Larger follows fast-shrinking norms. 0: the "
    "statistics clip stays at --dp_statistics_clip, a fixed clip noised with the whole noise "
    "multiplier (none of it spent on a clipped count), beside the update's adaptive clip: for "
    "statistics of bounded norm (--projector_output=unit).", lower=0)


DP_STATISTICS_CLIP_AT_BOUND = Field(
    "dp_statistics_clip_at_bound", False, "DP-DCCO with --projector_output=unit: clip each client's "
    "statistics at their bound, samples_per_client times the loss's per-image bound with unit "
    "encodings (sqrt(5) for CCO, sqrt(20) for VICReg, 2 for the spectral loss; 1e-6 above it for "
    "float32's round-off): a fixed clip chosen without data, which never clips (in place of "
    "--dp_statistics_clip; with gaussian_adaptive, --dp_statistics_clip_rate=0 keeps it fixed).")


DP_NORMS = Field(
    "dp_norms", "per_image", "DP-DCCO with one plain gradient step a client: how each client's "
    "update norm for its clip is computed. per_image: per-image gradients in vectorized passes; "
    "ghost: from one batched backward pass, each layer's inputs and output gradients "
    "(privacy/ghost.py: convolutions, dense layers of 2-D inputs, GroupNorm; no per-image "
    "gradient formed), refused for a model with other weighted layers (ViTs). The same clipped "
    "sum to round-off; on the mini model neither is faster (docs/performance.md).",
    choices=("per_image", "ghost"))


# float32 norms of unit encodings' statistics reach the bound times (1 + 2.4e-7): the clip sits that
# much above it, so that it clips no client.
BOUND_ROUNDING = 1e-6


# DP-DCCO's own fields beside `privacy.FIELDS` (its statistics release).
FIELDS = (DP_STATISTICS_CLIP, DP_STATISTICS_QUANTILE, DP_STATISTICS_CLIP_RATE,
          DP_STATISTICS_CLIP_AT_BOUND, DP_NORMS)


def statistics_clip(config) -> float:
  """The statistics clip of `config`: `dp_statistics_clip`, or with `dp_statistics_clip_at_bound`
  the bound of a client's statistics sum (ValueError, one line, where there is none)."""
  if not config.dp_statistics_clip_at_bound:
    return config.dp_statistics_clip
  if config.dp == "off":
    raise ValueError("--dp_statistics_clip_at_bound sets the clip of DP-DCCO's statistics release; "
                     "set --dp, or drop it")
  entry = losses.get_statistics(config.ssl)
  default = DP_STATISTICS_CLIP.default
  if config.projector_output != "unit" or entry.unit_bound is None:
    raise ValueError(f"--dp_statistics_clip_at_bound needs a bound on the statistics: use "
                     f"--projector_output=unit (got {config.projector_output!r}) with a loss that "
                     f"states one (--ssl={config.ssl})")
  if config.dp_statistics_clip != default:
    raise ValueError(f"--dp_statistics_clip_at_bound sets the statistics clip; drop "
                     f"--dp_statistics_clip={config.dp_statistics_clip}")
  if config.dp == "gaussian_adaptive" and config.dp_statistics_clip_rate:
    raise ValueError(f"--dp_statistics_clip_at_bound is a fixed clip; with --dp=gaussian_adaptive "
                     f"set --dp_statistics_clip_rate=0 (got {config.dp_statistics_clip_rate})")
  return config.samples_per_client * entry.unit_bound * (1 + BOUND_ROUNDING)


def from_config(config, releases: int) -> tuple[PrivacyConfig, float]:
  """(DCCO's privacy settings of an `ExperimentConfig`, its releases' public denominator: under DP
  the expected images per round, else 0)."""
  private = privacy_lib.from_config(config, releases=releases,
                                    statistics_clip=statistics_clip(config),
                                    statistics_quantile=config.dp_statistics_quantile,
                                    statistics_clip_rate=config.dp_statistics_clip_rate)
  privacy_lib.check_simulation(private, config.simulation)
  if not private.enabled:
    return private, 0.0
  if not data_lib.PARTITIONS[config.partition].fixed_size:
    raise ValueError(f"DP-DCCO divides its noised sums by the expected images per round, public "
                     f"only where every client holds --samples_per_client images; partition "
                     f"{config.partition!r} has clients of unequal size: use a fixed-size one")
  return private, float(config.clients_per_round * config.samples_per_client)


def check(cfg) -> None:
  """ValueError where a `DCCOConfig`'s privacy settings do not compose with its round."""
  if cfg.stale and cfg.privacy.any:
    raise ValueError("--dcco_statistics=previous releases each round's statistics beside its "
                     "update in one computation; DP, secure sums and compression are built for "
                     "the two-phase round: use --dcco_statistics=current")
  if cfg.privacy.enabled and not cfg.denominator > 0:
    raise ValueError(f"DP-DCCO divides its noised sums by a public count of images per round; "
                     f"got denominator {cfg.denominator}")
  if cfg.norms not in DP_NORMS.choices:
    raise ValueError(f"--dp_norms={cfg.norms!r}: choose one of {', '.join(DP_NORMS.choices)}")
  if cfg.augmentations < 1 or (cfg.augmentations > 1 and not cfg.privacy.enabled):
    raise ValueError(f"DP-DCCO's view pairs must be 1, or more with DP; got {cfg.augmentations}")


def batched_clipping(cfg) -> bool:
  """Whether DP-DCCO's phase 2 clips each client's update from per-image gradients computed in
  vectorized passes (`clipped_records`): where a client's update is one plain gradient step (its
  loss is then linear in its images' statistics). Otherwise, and with `cfg.clip_loop`, each real
  client of a slot trains in turn (`grouping.fold_clients`), the reference."""
  return (not cfg.clip_loop and cfg.local_steps == 1 and cfg.client_optimizer == "sgd")


# Per-image gradients held at once by `clipped_records`: a pass takes CLIP_FLOATS // P images (P the
# model's parameters; at least one whole client). 2**27 floats (512 MB): 183 images of the demo
# model (bin/benchmark --scenarios=dp_dcco_1024x1: 1.56-1.60x the non-private round).
CLIP_FLOATS = 2 ** 27


def clipped_records(model: FunctionalModel, term: StatisticsTerm, augment, learning_rate, weights,
                    seed, data, aggregate, clip, chunk: int | None = None):
  """Phase 2 of DP-DCCO at a slot without a loop over its clients: (sum_k of client k's record N_k
  Delta_k clipped to `clip`, the records' norms before the clip [K], the loss). Delta_k as
  `train_against` gives it (the start weights minus the trained ones); the loss is every client's,
  the aggregate's.

  With one plain gradient step, Delta_k = eta grad l_k, and l_k is linear in client k's statistics
  <>_k = (1/N_k) sum_n s_n (`StatisticsTerm.value`), so N_k Delta_k = eta sum_{n in k} grad l(s_n):
  per-image gradients of the linearized loss (`linearized`: G = dL/d<> taken once at the aggregate,
  `statistics_gradient`), taken `chunk` images at a time (whole clients: a larger client alone) in
  one `tf.vectorized_map` (one image per iteration: the encoder treats images apart; convolutions
  take `layers.sliced_filter_gradients`), summed by client, clipped (`privacy.clip.factors`) and added up.
  `chunk`: images a pass (None: `CLIP_FLOATS` // P)."""
  if chunk is None:
    chunk = max(1, CLIP_FLOATS // sum(int(np.prod(s.shape)) for s in model.weight_specs))
  entry = losses.get_statistics(term.ssl)
  v1, v2 = common.views(data, seed, augment)
  segments, count = client_segments(data)
  bounds = tf.math.segment_max(tf.range(1, tf.size(segments) + 1), segments)  # Each client's end.

  gradient, value = statistics_gradient(term, aggregate)

  def one_image(views):
    with tf.GradientTape() as tape, layers.sliced_filter_gradients():
      tape.watch(weights)
      f, g = common.encode_views(model, weights, views[0][None], views[1][None])
      linear = linearized(entry, gradient, f, g)
    return tape.gradient(linear, weights), linear

  @tf.function(autograph=False)  # The loop is explicit; no per-iteration intermediates kept.
  def loop(v1, v2, segments, bounds, zero):
    eta = tf.cast(learning_rate, zero.dtype)

    def body(start, total, norms):
      fits = tf.boolean_mask(bounds, bounds <= start + chunk)
      end = tf.maximum(tf.reduce_max(tf.concat([fits, [0]], 0)),
                       tf.reduce_min(tf.boolean_mask(bounds, bounds > start)))
      grads, _ = tf.vectorized_map(one_image, (v1[start:end], v2[start:end]))
      clients = segments[start:end] - segments[start]
      count = clients[-1] + 1
      # Per client: the sum of its images' gradients (each image its own client: as they are).
      grads = tf.cond(tf.equal(count, end - start), lambda: [tf.identity(g) for g in grads],
                      lambda: [tf.math.unsorted_segment_sum(g, clients, count) for g in grads])
      chunk_norms = eta * tf.sqrt(tf.add_n([
          tf.reduce_sum(tf.square(tf.reshape(g, [count, -1])), 1) for g in grads]))
      factor = clip_lib.factors(chunk_norms, clip) * eta
      total = [t + tf.tensordot(factor, g, [[0], [0]]) for t, g in zip(total, grads)]
      norms = tf.tensor_scatter_nd_update(
          norms, (tf.range(count) + segments[start])[:, None], chunk_norms)
      return end, total, norms

    _, total, norms = tf.while_loop(
        lambda start, *_: start < tf.size(segments), body,
        (tf.constant(0), [tf.zeros(s.shape, zero.dtype) for s in model.weight_specs],
         tf.zeros([count], zero.dtype)))
    return common.flatten(total), norms

  total, norms = loop(v1, v2, segments, bounds, tf.zeros([], weights[0].dtype))
  return total, norms, value


def ghost_records(model: FunctionalModel, term: StatisticsTerm, augment, learning_rate, weights,
                  seed, data, aggregate, clip):
  """`clipped_records` from one batched forward and backward pass (`privacy.ghost`): each client's
  norm from its rows' layer inputs and output gradients, the clipped sum as the batch's weight
  gradients with each row's output gradient scaled by its client's clip factor. None where a
  weight's layer has no ghost norm here (`ghost.uncovered`; a ViT's attention), at trace time."""
  entry = losses.get_statistics(term.ssl)
  v1, v2 = common.views(data, seed, augment)
  segments, count = client_segments(data)
  gradient, value = statistics_gradient(term, aggregate)
  with tf.GradientTape() as tape, layers.recording() as records:
    tape.watch(weights)
    f, g = common.encode_views(model, weights, v1, v2)
    total = linearized(entry, gradient, f, g, batch=True)
  if ghost.uncovered(records, weights, model.names) or not all(map(ghost.supported, records)):
    return None
  outputs = tape.gradient(total, [r.output for r in records])
  dims = [int(r.inputs.shape[-1]) for r in records if r.kind == "dense"] + [1]
  rows = losses.statistics.ClientRows(tf.concat([segments, segments], 0), count, max(dims))
  dtype = weights[0].dtype
  eta = tf.cast(learning_rate, dtype)
  norms = eta * tf.sqrt(tf.add_n([ghost.squared_norms(r, dy, rows)
                                  for r, dy in zip(records, outputs)]))
  factor = clip_lib.factors(norms * (1 + ghost.ROUNDING[dtype]), clip) * eta
  row_weights = tf.gather(factor, rows.segments)
  grads = {}
  for r, dy in zip(records, outputs):
    grads.update(ghost.weighted_gradients(r, dy, row_weights))
  return common.flatten([grads[id(w)] for w in weights]), norms, value


def statistics_gradient(term: StatisticsTerm, aggregate):
  """(G, the loss): G = the loss's gradient with respect to the statistics at the aggregate, by
  which every client's loss multiplies its own statistics (`StatisticsTerm.value`)."""
  entry = losses.get_statistics(term.ssl)
  stats = losses.statistics.as_statistics(entry, field_of(aggregate, "statistics"))
  with tf.GradientTape() as tape:
    tape.watch(list(stats.values()))
    value = term.value(stats, aggregate)
  return collections.OrderedDict(zip(stats, tape.gradient(value, list(stats.values())))), value


def linearized(entry, gradient, f, g, batch: bool = False) -> tf.Tensor:
  """sum over the statistics of <G_s, s(f, g)> for one image's encodings `f`, `g` ([1, d]): its
  loss's linear part, whose gradient is the client's. An outer-product statistic a b^T enters as
  a^T G b, never formed (d x d per image). `batch`: summed over the rows of `f`, `g` ([N, d])."""
  total = []
  for t in entry.terms:
    a = t.of(f, g) if batch else t.of(f, g)[0]
    if t.outer is None:
      total.append(tf.reduce_sum(gradient[t.name] * a))
    elif batch:
      total.append(tf.reduce_sum(a * tf.matmul(t.outer(f, g), gradient[t.name], transpose_b=True)))
    else:
      total.append(tf.reduce_sum(a * tf.linalg.matvec(gradient[t.name], t.outer(f, g)[0])))
  return tf.add_n(total)


def client_segments(data):
  """(each image's client index, the number of clients) of a slot (reference mode: one client)."""
  sizes = data["sizes"] if isinstance(data, dict) and "sizes" in data else getattr(
      data, "sizes", None)
  n = tf.shape(data["images"] if isinstance(data, dict) else data.images)[0]
  if sizes is None:
    return tf.zeros([n], tf.int32), 1
  count = tf.shape(sizes)[0]
  return tf.repeat(tf.range(count), sizes), count


def private_phases(process) -> list[composer.Phase]:
  """DP-DCCO: both phases through `privacy.release` (each real client's N_k-times value clipped
  and summed in its slot, `PrivateRelease.fold`; the sum noised over the public denominator,
  `ReleaseProcess.release`), as DP-FedAvg's update is (`aggregators.private`). Sets
  `variance_eps`."""
  cfg, privacy, sigma = process.config, process.config.privacy, process.config.privacy.sigma
  stat_specs = [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype)) for t in process.stats_type]
  # A client's values are sums over its N_k images; gaussian_adaptive's votes count clients.
  records = float(privacy.clients_per_round)
  stats_phase = PrivateRelease(privacy, sigma, cfg.denominator, stat_specs, release=0,
                               statistics=True, records=records).create()
  update_phase = PrivateRelease(privacy, sigma, cfg.denominator,
                                [common.flat_spec(process.model.weight_specs)], release=1,
                                records=records).create()
  process.noise_multiplier = sigma
  # The noised <F^2> and <F>^2 are each off by about sigma C_s / D: a variance below that is
  # noise, and dividing by its square root amplifies the noise without bound (seen: losses of
  # 1e14 at sigma 1). Post-processing (free under DP): the noise's scale joins eps, at the clip
  # the round's statistics were released with (gaussian_adaptive's moves; `variance_eps`).
  process.variance_eps = cfg.loss.eps
  eps_per_clip = (0.0 if privacy.statistics_unclipped else
                  sigma * privacy.noise_scale / cfg.denominator)
  process.eps_per_clip = eps_per_clip
  process.variance_eps += eps_per_clip * privacy.clip_value(statistics=True)
  process.dp_aggregate_type = tff.StructWithPythonType(
      [("statistics", process.stats_type), ("count", tff.TensorType(process.dtype.as_numpy_dtype)),
       ("eps", tff.TensorType(process.dtype.as_numpy_dtype))],
      collections.OrderedDict)
  process.client_statistics_sum = _client_statistics_sum(process, stats_phase)
  process.client_update_sum = _client_update_sum(process, update_phase)
  entry, dtype, loss_eps = cfg.loss, process.dtype, cfg.loss.eps

  @tff.tensorflow.computation(tff.StructType([("value", tff.StructWithPythonType(
      [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in stat_specs], list)),
                                              ("clip", np.float32)]))
  def as_aggregate(value):
    # The noised sum over the public denominator, which is also the count; the variance floor
    # at the clip the statistics were released with.
    return collections.OrderedDict(
        statistics=collections.OrderedDict(zip(entry.names, value.value)),
        count=tf.constant(cfg.denominator, dtype),
        eps=tf.cast(loss_eps + eps_per_clip * tf.cast(value.clip, tf.float64), dtype))

  def statistics(agg, out, names):
    del out
    # This round's clip (an adaptive one moves).
    clip = stats_phase.clip(names["aggregator_states"]["statistics"])
    return collections.OrderedDict(
        aggregate=tff.federated_map(as_aggregate, tff.federated_zip(
            collections.OrderedDict(value=agg.result, clip=clip))),
        statistics_measured=agg.measurements, statistics_clip=clip)

  def update(agg, out, names):
    s, u = names["statistics_measured"], agg.measurements
    return collections.OrderedDict(
        update=agg.result[0], loss=tff.federated_mean(out[2], weight=out[1]),
        diagnostics=tff.federated_zip(collections.OrderedDict(
            statistics_norm=s.norm, statistics_clipped=s.clipped,
            statistics_clip=names["statistics_clip"], statistics_signal=s.signal_norm,
            statistics_noise=s.noise_norm,
            update_norm=u.norm, update_clipped=u.clipped,
            update_clip=update_phase.clip(names["aggregator_states"]["update"]),
            update_signal=u.signal_norm, update_noise=u.noise_norm)))

  return [
      composer.Phase("statistics", process.client_statistics_sum,
                     ("weights", "seed", "data", "params"), composer.Release(stats_phase),
                     ("aggregate", "statistics_measured", "statistics_clip"), statistics,
                     value=lambda out, at: out, weight=None),
      composer.Phase("update", process.client_update_sum,
                     ("weights", "seed", "aggregate", "data", "params"),
                     composer.Release(update_phase), ("update", "loss", "diagnostics"), update,
                     weight=None)]

def _client_statistics_sum(process, phase):
  """Phase 1 at a slot under DP: each real client's N_k <>_k clipped to the statistics clip,
  summed (one batched pass, `StatisticsLoss.clipped_sum`), as `PrivateRelease.fold` would."""
  model, cfg, specs, release = process.model, process.config, process.model.weight_specs, phase.release

  m = cfg.augmentations

  @tff.tensorflow.computation(process.w_type, common.SEED_TYPE, process.data_type, phase.params_type)
  def client_statistics_sum(weights, seed, data, params):
    weights = common.unflatten_tensors(weights, specs)
    data = common.multiplied(data, m)
    v1, v2 = common.views(data, seed, cfg.augment)
    f, g = common.encode_views(model, weights, v1, v2)
    segments, count = client_segments(data)
    # A client's record is its images' sum over the m copies / m: the m-fold sum clipped to
    # m C, then / m (min(1, mC / |S|) S / m = min(1, C / |S / m|) S / m).
    sums, norms = cfg.loss.clipped_sum(f, g, segments, count, m * release.clip_of(params))
    return release.presummed([v / m for v in sums.values()], norms / m, params)

  return client_statistics_sum

def _client_update_sum(process, phase):
  """Phase 2 at a slot under DP: each real client's N_k Delta_k clipped to the update clip and
  summed (`PrivateRelease.fold`), with the images and their loss."""
  model, specs, release = process.model, process.model.weight_specs, phase.release
  client = client_config(process.config, process.variance_eps)
  batched = batched_clipping(process.config)
  m, norms_kind = process.config.augmentations, process.config.norms

  @tff.tensorflow.computation(process.w_type, common.SEED_TYPE, process.dp_aggregate_type,
                              process.data_type, phase.params_type)
  def client_update_sum(weights, seed, aggregate, data, params):
    weights = common.unflatten_tensors(weights, specs)
    if batched:  # With m copies an image: the m-fold record clipped to m C, then / m.
      args = (model, client.terms[0], client.augment, client.client_learning_rate, weights, seed,
              common.multiplied(data, m), aggregate, m * release.clip_of(params))
      if norms_kind == "ghost":
        ghosted = ghost_records(*args)
        if ghosted is None:
          raise ValueError("--dp_norms=ghost: a layer of this model has no ghost norm "
                           "(privacy.ghost.KINDS: convolutions, dense layers of 2-D inputs, "
                           "GroupNorm); use --dp_norms=per_image")
        record, norms, loss = ghosted
      else:
        record, norms, loss = clipped_records(*args)
      n = tf.cast(tf.size(client_segments(data)[0]), tf.float32)
      return (release.presummed([record / m], tf.cast(norms / m, tf.float32), params), n,
              tf.cast(loss, tf.float32))

    def one_client(images, ids, acc):
      # Its update from the mean loss over the m copies' views: the mean of the m updates.
      delta, loss, _ = train_against(model, client, weights, seed, common.multiplied(
          {"images": images, "ids": ids}, m), aggregate)
      n = tf.cast(tf.shape(ids)[0], tf.float32)
      return (release.fold(acc[0], params, [n * common.flatten(delta)]), acc[1] + n,
              acc[2] + n * loss)

    zero = tf.constant(0.0)
    start = (release.empty(), zero, zero)
    if process.simulation.grouped:
      contribution, n, loss_sum = grouping.fold_clients(data, one_client, start)
    else:
      contribution, n, loss_sum = one_client(data.images, data.ids, start)
    return contribution, n, loss_sum / n

  return client_update_sum


def noise_to_signal(noise, signal) -> np.float32:
  """A release's noise norm over its clean sum's norm (inf for a zero sum with noise)."""
  noise, signal = float(noise), float(signal)
  return np.float32(noise / signal if signal > 0 else (np.inf if noise > 0 else 0.0))


def measurements(diagnostics, clients: int) -> collections.OrderedDict:
  """A private round's aggregation.csv columns: per client (its N_k-times sums) each release's mean
  norm and the fraction its clip shortened, the clip, and its noise-to-signal (the noise's norm
  over the clipped sum's, `ReleaseProcess.release_of`)."""
  d, k = diagnostics, float(clients)
  return collections.OrderedDict(
      clients=np.float32(k), statistics_norm=np.float32(d["statistics_norm"] / k),
      statistics_clipped_fraction=np.float32(d["statistics_clipped"] / k),
      statistics_clip=np.float32(d["statistics_clip"]),
      statistics_noise_to_signal=noise_to_signal(d["statistics_noise"], d["statistics_signal"]),
      update_norm=np.float32(d["update_norm"] / k),
      update_clipped_fraction=np.float32(d["update_clipped"] / k),
      update_clip=np.float32(d["update_clip"]),
      update_noise_to_signal=noise_to_signal(d["update_noise"], d["update_signal"]))
