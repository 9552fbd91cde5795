"""Per-client gradient norms and clipped gradient sums from one batched backward pass, without any
client's gradient ("ghost" norms: Goodfellow 2015, Li et al. 2022; with the weighted sum of the
book-keeping kind, Bu et al. 2023): DP-DCCO's phase-2 records (`methods.dcco_private`).

A forward pass under `models.layers.recording` gives each layer's input x and output y; one backward
pass gives dL/dy for every recorded layer at once. With rows that a model treats apart (GroupNorm,
weight standardization and dense layers of 2-D inputs never mix rows), client k's gradient is a sum
over its rows only, so per layer:

  dense      W: sum_{r in k} x_r dy_r^T, ||.||^2 = sum_{r,s in k} (x_r . x_s)(dy_r . dy_s), which
             never forms the [d_in, d_out] matrix (`rows.pair_sums`); bias: ||sum_{r in k} dy_r||^2.
  conv       G_k = sum_{r in k} sum_t patch_{r,t} dy_{r,t}^T, formed per client for one kernel offset
             at a time ([K, c_in, c_out]), or, where that costs more (small maps of many filters:
             `_gram_pays`), never formed: per output filter o, sum_e G_eo^2 =
             sum_{r,s in k} sum_{t,u} (patch_rt . patch_su) dy_rto dy_suo from the client's pairs of
             rows' Gram matrices of x; weight standardization W_hat = (W - mean) * inv maps a
             gradient g of W_hat (per output filter o, n = kh kw c_in entries) to
             inv_o (g - mean(g) - W_hat_o mean(g W_hat_o)), whose squared norm is
             inv_o^2 (|g|^2 - (sum g)^2 / n - (2 - r_o)(sum g W_hat_o)^2 / n), r_o = mean(W_hat_o^2).
  group_norm gamma: sum over a client's rows and positions of dy x_hat; beta: of dy.

The clipped sum is then sum_k c_k grad_k = sum_r c_{k(r)} x_r dy_r^T: each layer's weight gradient
with every row's dy scaled by its client's factor (`weighted_gradients`), computed as the batch's.

Not TensorFlow Privacy's `fast_gradient_clipping` (0.9.0): it has no convolution, GroupNorm or
weight-standardization rule, groups examples into consecutive microbatches only (a client's rows
here are in both views' halves of the batch), and walks the Keras graph layer by layer where
`FunctionalModel` calls the model whole (BUILD-notes.md, "Privacy on the wire").
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# The clip factor reads a client's norm this much larger than computed: the norm and the summed
# gradient come from different arithmetic (einsums and weight standardization's closed form against
# the batch's filter gradient), which in float32 differ by up to 1.4e-6 relative (measured by
# tests/privacy/test_ghost_norms.py, which keeps the gap under a tenth of the margin), so that the
# clip bounds every client's share of the sum as the noise assumes.
ROUNDING = {tf.float32: 1e-4, tf.float64: 1e-12}

KINDS = ("conv", "dense", "group_norm")


def uncovered(records, weights, names) -> list[str]:
  """The names of `weights` that no record multiplies exactly once (each must: a weight a model
  uses twice, or in a layer `recording` does not see, has no ghost norm here)."""
  seen = {}
  for r in records:
    for w in r.weights.values():
      seen[id(w)] = seen.get(id(w), 0) + 1
  return [n for w, n in zip(weights, names) if seen.get(id(w), 0) != 1]


def supported(record) -> bool:
  """Whether this module computes `record`'s norms (undilated NHWC convolutions)."""
  if record.kind == "conv":
    layer = record.layer
    return (tuple(layer.dilation_rate) == (1, 1) and layer.data_format == "channels_last"
            and getattr(layer, "groups", 1) == 1)
  return record.kind in KINDS


def squared_norms(record, dy, rows) -> tf.Tensor:
  """[K]: each client's squared gradient norm of `record`'s weights, from its input and `dy`
  (dL/d output, [R, ...]). `rows`: each row's client (`losses.statistics.ClientRows`)."""
  x = record.inputs
  if record.kind == "dense":
    total = rows.pair_sums(x, dy)
    if "bias" in record.weights:
      total += tf.reduce_sum(tf.square(rows.segment_sum(dy)), 1)
    return tf.maximum(total, 0.0)
  if record.kind == "group_norm":
    outer = list(range(1, x.shape.rank - 2))  # Positions; the last two axes are the channels.
    channels = [-1, x.shape[-2] * x.shape[-1]]
    gamma = rows.segment_sum(tf.reshape(tf.reduce_sum(dy * x, outer), channels))
    beta = rows.segment_sum(tf.reshape(tf.reduce_sum(dy, outer), channels))
    return tf.reduce_sum(tf.square(gamma), 1) + tf.reduce_sum(tf.square(beta), 1)
  return _conv_squared_norms(record, dy, rows)


def _conv_filter_sums(record, dy, rows):
  """Per client and output filter ([K, c_out] each): sum g^2, sum g and sum g W_hat over the
  filter's entries of the client's kernel gradient g, formed per kernel offset."""
  squares = sums = aligned = 0.0
  standardized = record.standardized
  for (i, j), patch in _offsets(record.inputs, dy, record.layer):
    g = rows.segment_sum(tf.einsum("rhwc,rhwd->rcd", patch, dy))  # [K, c_in, c_out]
    squares += tf.reduce_sum(tf.square(g), 1)
    if standardized is not None:
      sums += tf.reduce_sum(g, 1)
      aligned += tf.reduce_sum(g * standardized[i, j][None], 1)
  return squares, sums, aligned


def _padded_positions(record, dy):
  """(x padded as the layer pads it, flattened to [R, P, c_in]; [T, kh kw]: the padded position
  each output position reads at each kernel offset)."""
  layer = record.layer
  kh, kw = layer.kernel_size
  (sh, sw), (oh, ow) = layer.strides, dy.shape[1:3]
  x = _padded(record.inputs, dy, layer)
  hp, wp = x.shape[1:3]
  a, b, i, j = np.meshgrid(np.arange(oh), np.arange(ow), np.arange(kh), np.arange(kw),
                           indexing="ij")
  index = ((a * sh + i) * wp + (b * sw + j)).reshape(oh * ow, kh * kw)
  return tf.reshape(x, [-1, hp * wp, x.shape[-1]]), index


def _conv_filter_sums_by_gram(record, dy, rows):
  """`_conv_filter_sums` from Gram matrices of a client's pairs of rows, without any kernel
  gradient: sum_e g_eo^2 = sum_{r,s in k} sum_{t,u} (patch_rt . patch_su) dy_rto dy_suo, where
  patch_rt . patch_su = sum over kernel offsets of x_r . x_s at the positions they read; sum_e g_eo
  and sum_e g_eo W_hat_eo are per row (each patch's entries summed; the standardized convolution's
  output), summed by client. It pays where positions are few and filters many (a small map)."""
  xp, index = _padded_positions(record, dy)
  points, offsets = index.shape
  p = int(xp.shape[1])
  dyf = tf.reshape(dy, [-1, points, dy.shape[-1]])  # [R, T, c_out]
  first, second, client = rows._pair_indices()  # pylint: disable=protected-access
  gram = tf.einsum("npc,nqc->npq", tf.gather(xp, first), tf.gather(xp, second))  # [n, P, P]
  flat = (index[:, None, :] * p + index[None, :, :]).reshape(-1)  # [T, T, offsets]
  patch_gram = tf.reduce_sum(tf.reshape(tf.gather(tf.reshape(gram, [-1, p * p]), flat, axis=1),
                                        [-1, points, points, offsets]), -1)  # [n, T, T]
  second_dy = tf.einsum("ntu,nuo->nto", patch_gram, tf.gather(dyf, second))
  squares = tf.math.unsorted_segment_sum(
      tf.reduce_sum(tf.gather(dyf, first) * second_dy, 1), client, rows.count)
  standardized = record.standardized
  if standardized is None:
    return squares, 0.0, 0.0
  patch_sums = tf.reduce_sum(tf.gather(tf.reduce_sum(xp, -1), index, axis=1), -1)  # [R, T]
  sums = rows.segment_sum(tf.einsum("rt,rto->ro", patch_sums, dyf))
  layer = record.layer
  y = tf.nn.conv2d(record.inputs, standardized, [1, *layer.strides, 1], layer.padding.upper())
  aligned = rows.segment_sum(tf.reduce_sum(y * dy, [1, 2]))
  return squares, sums, aligned


def _gram_pays(record, dy, rows) -> tf.Tensor:
  """Whether `_conv_filter_sums_by_gram` takes fewer multiply-adds than forming each client's
  kernel gradient (its pairs' Gram matrices against every row's gradient, per kernel offset)."""
  kh, kw, c_in, c_out = record.weights["kernel"].shape.as_list()
  height, width = record.inputs.shape[1:3]
  points = int(dy.shape[1]) * int(dy.shape[2])
  padded = (height + kh) * (width + kw)  # At least the padded map.
  per_pair = padded * padded * c_in + points * points * (c_out + kh * kw)
  per_row = points * kh * kw * c_in * c_out
  pairs = tf.cast(tf.reduce_sum(tf.square(rows._sizes)), tf.float64)  # pylint: disable=protected-access
  return pairs * per_pair < tf.cast(tf.size(rows.segments), tf.float64) * per_row


def _conv_squared_norms(record, dy, rows) -> tf.Tensor:
  kernel = record.weights["kernel"]
  kh, kw, _, _ = kernel.shape.as_list()
  standardized = record.standardized
  squares, sums, aligned = tf.cond(
      _gram_pays(record, dy, rows),
      lambda: _as_three(_conv_filter_sums_by_gram(record, dy, rows)),
      lambda: _as_three(_conv_filter_sums(record, dy, rows)))
  if standardized is None:
    total = tf.reduce_sum(squares, 1)
  else:
    n = float(kh * kw * kernel.shape[2])
    inv_sq = 1.0 / (_variance(kernel) + record.layer.ws_eps)  # [c_out]
    r = tf.reduce_mean(tf.square(standardized), [0, 1, 2])
    total = tf.reduce_sum(inv_sq * tf.maximum(
        squares - tf.square(sums) / n - (2.0 - r) * tf.square(aligned) / n, 0.0), 1)
  if "bias" in record.weights:
    total += tf.reduce_sum(tf.square(rows.segment_sum(tf.reduce_sum(dy, [1, 2]))), 1)
  return total


def _as_three(parts):
  """Both branches of a tf.cond give three [K, c_out] tensors (a term a layer has no use for: 0)."""
  squares = parts[0]
  return tuple(p if tf.is_tensor(p) else tf.zeros_like(squares) for p in parts)


def _variance(kernel) -> tf.Tensor:
  centered = kernel - tf.reduce_mean(kernel, [0, 1, 2], keepdims=True)
  return tf.reduce_mean(tf.square(centered), [0, 1, 2])


def _padded(x, dy, layer):
  """x padded as the layer's "SAME" pads it (as it is for "VALID")."""
  kh, kw = layer.kernel_size
  (sh, sw), (height, width), (oh, ow) = layer.strides, x.shape[1:3], dy.shape[1:3]
  if layer.padding.upper() != "SAME":
    return x
  ph, pw = max((oh - 1) * sh + kh - height, 0), max((ow - 1) * sw + kw - width, 0)
  return tf.pad(x, [[0, 0], [ph // 2, ph - ph // 2], [pw // 2, pw - pw // 2], [0, 0]])


def _offsets(x, dy, layer):
  """((i, j), x's rows at kernel offset (i, j) under each output position [R, oh, ow, c_in]) for
  every offset: a convolution's kernel gradient at (i, j) is sum over positions of these times dy
  (x padded as "SAME" pads it; `models.layers.sliced_filter_gradient`)."""
  kh, kw = layer.kernel_size
  (sh, sw), (oh, ow) = layer.strides, dy.shape[1:3]
  x = _padded(x, dy, layer)
  for i in range(kh):
    for j in range(kw):
      yield (i, j), x[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :]


def weighted_gradients(record, dy, row_weights) -> dict[int, tf.Tensor]:
  """{id(weight tensor): the gradient of sum_r w_r L_r for each of `record`'s weights}, from its
  input and dy = dL/d output with L = sum_r L_r, row by row: the batch's weight gradient with each
  row's dy scaled by `row_weights` [R] (its client's clip factor)."""
  w = tf.reshape(tf.cast(row_weights, dy.dtype), [-1] + [1] * (dy.shape.rank - 1))
  scaled, x, out = dy * w, record.inputs, {}
  weights = record.weights
  if record.kind == "dense":
    out[id(weights["kernel"])] = tf.matmul(x, scaled, transpose_a=True)
    if "bias" in weights:
      out[id(weights["bias"])] = tf.reduce_sum(scaled, 0)
    return out
  if record.kind == "group_norm":
    outer = list(range(x.shape.rank - 2))
    out[id(weights["gamma"])] = tf.reshape(tf.reduce_sum(scaled * x, outer), [-1])
    out[id(weights["beta"])] = tf.reshape(tf.reduce_sum(scaled, outer), [-1])
    return out
  layer, kernel = record.layer, weights["kernel"]
  grad = tf.compat.v1.nn.conv2d_backprop_filter(
      x, tf.shape(kernel), scaled, [1, *layer.strides, 1], layer.padding.upper())
  if record.standardized is not None:  # Through the standardization (`layers.standardize`).
    axes, w_hat = [0, 1, 2], record.standardized
    inv = tf.math.rsqrt(_variance(kernel) + layer.ws_eps)
    grad = inv * (grad - tf.reduce_mean(grad, axes, keepdims=True)
                  - w_hat * tf.reduce_mean(grad * w_hat, axes, keepdims=True))
  out[id(kernel)] = grad
  if "bias" in weights:
    out[id(weights["bias"])] = tf.reduce_sum(scaled, [0, 1, 2])
  return out
