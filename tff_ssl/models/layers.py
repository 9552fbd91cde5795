"""Normalization layers: weight-standardized convolution and GroupNorm, which do not depend on the batch
(the encoders'), and batch-statistics normalization (the SSL heads' with `--head_norm=batch`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading

import tensorflow as tf

from tff_ssl.config_fields import Field

MAX_GROUPS = 32  # DCCO: GroupNorm with 32 groups (Sec. 4.1).

# --precision: the dtype the convolutions and dense layers multiply in (None: their inputs'). Everything
# else (normalization, activations, losses, statistics, clipping) stays in float32.
PRECISIONS = {"float32": None, "mixed_bfloat16": tf.bfloat16}
_precision = threading.local()
PRECISION = Field(
    "precision", "float32", "What convolutions and dense layers multiply in: float32, or "
    "mixed_bfloat16 (bfloat16 operands, float32 results; weights, normalization, losses, "
    "statistics, DP clipping and accounting stay float32). Faster only on CPUs with AMX or "
    "AVX512-BF16 (docs/performance.md); ResNets and the plain convnets only.",
    choices=tuple(PRECISIONS))


@contextlib.contextmanager
def precision(name: str):
  """Layers of this module constructed within it multiply in `name`'s dtype (`PRECISIONS`): with
  "mixed_bfloat16" a convolution or dense layer casts its float32 input and weight to bfloat16,
  multiplies (oneDNN: AMX or AVX512-BF16 where the CPU has them), and casts its output back, so its
  gradients are bfloat16 products too. Weights, their updates and every other op stay float32 (unlike
  Keras' mixed_bfloat16 policy, which computes whole layers, normalization included, in bfloat16)."""
  if name not in PRECISIONS:
    raise ValueError(f"unknown precision {name!r}; choose one of {sorted(PRECISIONS)}")
  previous = getattr(_precision, "name", "float32")
  _precision.name = name
  try:
    yield
  finally:
    _precision.name = previous


def current_precision() -> str:
  return getattr(_precision, "name", "float32")


# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) at or above which it multiplies bfloat16 natively.
_NATIVE_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                     "AVX512_CORE_AMX_FP16", "ALL", "DEFAULT")


def native_bfloat16(cpuinfo: str = "/proc/cpuinfo") -> bool:
  """Whether oneDNN multiplies bfloat16 in hardware here: the CPU has AMX-BF16 or AVX512-BF16 and
  ONEDNN_MAX_CPU_ISA does not cap oneDNN below them. Elsewhere it converts to float32 and back, and
  mixed_bfloat16 is slower than float32 (docs/performance.md)."""
  cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
  if cap not in _NATIVE_BF16_ISAS:
    return False
  try:
    with open(cpuinfo) as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  except OSError:
    return False
  return "amx_bf16" in flags or "avx512_bf16" in flags


def bfloat16_warning(precision_name: str) -> str | None:
  """The line to print where `precision_name` multiplies in bfloat16 on a CPU that emulates it."""
  if PRECISIONS[precision_name] is None or native_bfloat16():
    return None
  return (f"--precision={precision_name} on a CPU without AMX or AVX512-BF16 (or with "
          f"ONEDNN_MAX_CPU_ISA capping them): bfloat16 is emulated and slower than float32 "
          f"(docs/performance.md); use --precision=float32 here")


class _PrecisionMixin:
  """A layer's `precision` (from the `precision` scope it was constructed in, or given), kept in its
  config, and `_operands` casting what it multiplies to that precision's dtype."""

  def _init_precision(self, precision_name: str | None) -> None:
    self.precision = precision_name or current_precision()
    if self.precision not in PRECISIONS:
      raise ValueError(f"unknown precision {self.precision!r}; choose one of {sorted(PRECISIONS)}")

  def _operands(self, *tensors):
    dtype = PRECISIONS[self.precision]
    return tensors if dtype is None else tuple(tf.cast(t, dtype) for t in tensors)

  def _result(self, y, like):
    return y if y.dtype == like.dtype else tf.cast(y, like.dtype)


class Conv2D(_PrecisionMixin, tf.keras.layers.Conv2D):
  """Keras' Conv2D multiplying in its `precision` (the class keeps Keras' name, so automatic layer
  names are unchanged)."""

  def __init__(self, *args, precision: str | None = None, **kwargs):
    super().__init__(*args, **kwargs)
    self._init_precision(precision)

  def convolution_op(self, inputs, kernel):
    y = self._result(super().convolution_op(*self._operands(inputs, kernel)), inputs)
    _record(self, "conv", inputs, y, kernel=kernel)
    return y

  def get_config(self):
    return {**super().get_config(), "precision": self.precision}


class Dense(_PrecisionMixin, tf.keras.layers.Dense):
  """Keras' Dense (of 2-D inputs) multiplying in its `precision`."""

  def __init__(self, *args, precision: str | None = None, **kwargs):
    super().__init__(*args, **kwargs)
    self._init_precision(precision)

  def call(self, inputs):
    recorded = recording_active() and inputs.shape.rank == 2
    if (PRECISIONS[self.precision] is None or inputs.shape.rank != 2) and not recorded:
      return super().call(inputs)
    y = self._result(tf.matmul(*self._operands(inputs, self.kernel)), inputs)
    if self.use_bias:
      y = tf.nn.bias_add(y, self.bias)
    _record(self, "dense", inputs, y, kernel=self.kernel)
    return self.activation(y) if self.activation is not None else y

  def get_config(self):
    return {**super().get_config(), "precision": self.precision}


class WSConv2D(Conv2D):
  """Conv2D with Weight Standardization (Qiao et al., 2019).

  Each output filter of the kernel is standardized to zero mean and unit variance over its
  (height, width, in_channels) entries before the convolution; the stored kernel is unconstrained.
  """

  def __init__(self, *args, ws_eps: float = 1e-5, **kwargs):
    super().__init__(*args, **kwargs)
    self.ws_eps = ws_eps

  def standardized_kernel(self, kernel: tf.Tensor) -> tf.Tensor:
    return standardize(kernel, [0, 1, 2], self.ws_eps)

  def convolution_op(self, inputs, kernel):
    raw, kernel = kernel, self.standardized_kernel(kernel)  # In float32: a per-filter normalization.
    if getattr(_gradients, "sliced", False):
      if tuple(self.dilation_rate) != (1, 1) or self.data_format != "channels_last":
        raise ValueError(f"{self.name}: sliced filter gradients take undilated NHWC "
                         f"convolutions; got dilation {self.dilation_rate}, {self.data_format}")
      return self._result(sliced_conv2d(*self._operands(inputs, kernel), tuple(self.strides),
                                        self.padding.upper()), inputs)
    y = self._result(tf.keras.layers.Conv2D.convolution_op(self, *self._operands(inputs, kernel)),
                     inputs)
    _record(self, "conv", inputs, y, kernel=raw, standardized=kernel)
    return y

  def get_config(self):
    return {**super().get_config(), "ws_eps": self.ws_eps}


def standardize(x: tf.Tensor, axes: list[int], epsilon: float) -> tf.Tensor:
  """(x - mean) / sqrt(var + epsilon) over `axes` (kept), with its gradient in closed form:
  inv * (g - mean(g) - x_hat * mean(g * x_hat)). The same function and gradient as autodiff through
  tf.nn.moments up to float round-off, in about a third of the graph ops: building a training step's
  graph is paid per op (~1 ms each on a 2-core CPU), and autodiff's broadcasting gradients made the
  normalizations most of a ResNet's ops (docs/performance.md, "Graph building")."""

  @tf.custom_gradient
  def fn(x):
    centered = x - tf.reduce_mean(x, axes, keepdims=True)
    inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axes, keepdims=True) + epsilon)
    x_hat = centered * inv

    def grad(g):
      return inv * (g - tf.reduce_mean(g, axes, keepdims=True)
                    - x_hat * tf.reduce_mean(g * x_hat, axes, keepdims=True))
    return x_hat, grad

  return fn(x)


_gradients = threading.local()


@contextlib.contextmanager
def sliced_filter_gradients():
  """Within it (at trace time), a `WSConv2D` takes its kernel's gradient as one einsum of a strided
  slice of its input with its output's gradient per kernel offset (`sliced_conv2d`), not TF's
  Conv2DBackpropFilter, which `tf.vectorized_map` cannot vectorize over per-example inputs (pfor
  falls back to a while_loop over the examples): per-example gradients at about batch cost (DP-DCCO's
  per-client clipping, `methods.dcco_private.clipped_records`). The same gradient up to round-off."""
  previous = getattr(_gradients, "sliced", False)
  _gradients.sliced = True
  try:
    yield
  finally:
    _gradients.sliced = previous


def sliced_conv2d(x, kernel, strides, padding: str):
  """tf.nn.conv2d (NHWC, undilated) whose kernel gradient is `sliced_filter_gradient`."""
  stride = [1, strides[0], strides[1], 1]

  @tf.custom_gradient
  def conv(x, kernel):
    def grad(dy):
      dx = tf.nn.conv2d_transpose(dy, kernel, tf.shape(x), stride, padding)
      return dx, sliced_filter_gradient(x, dy, kernel.shape, strides, padding)
    return tf.nn.conv2d(x, kernel, stride, padding), grad

  return conv(x, kernel)


def sliced_filter_gradient(x, dy, kernel_shape, strides, padding: str) -> tf.Tensor:
  """The kernel gradient of conv2d(x) given its output's gradient `dy`: for each kernel offset
  (i, j), sum over images and positions of x[i + s h, j + s w, :]^T dy[h, w, :] (x padded as "SAME"
  pads it). Needs static spatial shapes."""
  kh, kw = int(kernel_shape[0]), int(kernel_shape[1])
  (sh, sw), (height, width), (oh, ow) = strides, x.shape[1:3], dy.shape[1:3]
  if padding == "SAME":
    ph, pw = max((oh - 1) * sh + kh - height, 0), max((ow - 1) * sw + kw - width, 0)
    x = tf.pad(x, [[0, 0], [ph // 2, ph - ph // 2], [pw // 2, pw - pw // 2], [0, 0]])
  return tf.stack([
      tf.stack([tf.einsum("bhwc,bhwd->cd",
                          x[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :], dy)
                for j in range(kw)])
      for i in range(kh)])


_recording = threading.local()


@dataclasses.dataclass
class Recorded:
  """One call of a layer with weights, as `recording` saw it: `kind` "conv" (Conv2D, WSConv2D),
  "dense" (Dense of [B, D] inputs) or "group_norm"; `weights` its weight tensors by role ("kernel",
  "bias", "gamma", "beta"); `inputs` what multiplies its weights (a convolution's or dense layer's
  input; GroupNorm's standardized input x_hat, grouped [B, ..., groups, channels / groups]);
  `output` the tensor at which the loss's gradient gives the weights' (before any activation; a
  convolution's before its bias); `layer` the Keras layer (strides, padding); `standardized` a
  WSConv2D's standardized kernel (its raw kernel is `weights["kernel"]`)."""

  kind: str
  layer: tf.keras.layers.Layer
  weights: dict
  inputs: tf.Tensor
  output: tf.Tensor
  standardized: tf.Tensor | None = None


@contextlib.contextmanager
def recording():
  """Within it (at trace time), each call of a Conv2D, WSConv2D, Dense (of 2-D inputs) or
  GroupNormalization appends its `Recorded` to the yielded list: what per-client gradient norms
  need without per-client gradients (`privacy.ghost`). The layers compute the same function."""
  previous = getattr(_recording, "records", None)
  _recording.records = records = []
  try:
    yield records
  finally:
    _recording.records = previous


def recording_active() -> bool:
  return getattr(_recording, "records", None) is not None


def _record(layer, kind: str, inputs, output, **parts) -> None:
  records = getattr(_recording, "records", None)
  if records is None:
    return
  standardized = parts.pop("standardized", None)
  if kind in ("conv", "dense") and layer.use_bias:
    parts["bias"] = layer.bias
  records.append(Recorded(kind, layer, parts, inputs, output, standardized))


def num_groups(channels: int, max_groups: int = MAX_GROUPS, min_group_size: int = 1) -> int:
  """gcd(channels, max_groups) (32 whenever it divides), halved until groups hold at least
  `min_group_size` channels."""
  g = math.gcd(channels, max_groups)
  while g > 1 and channels // g < min_group_size:
    g //= 2
  return g


class GroupNormalization(tf.keras.layers.GroupNormalization):
  """Keras' GroupNormalization with plain moments when there is no mask: the same layer (weights,
  names, serialization: the class keeps Keras' name, so automatic layer names are unchanged) and the
  same function up to float round-off.

  Keras' `call` always builds a mask of ones the size of the input and takes weighted moments. Where the
  batch dimension is unknown when the graph is built (a TFF computation's `[None, ...]` client data)
  nothing folds that mask away, and the layer costs 1.7x as much (ResNet-14's forward pass 1.33x:
  0.35 s vs 0.26 s for 1,024 images on 2 cores; `BUILD-notes.md`, "Grouped simulation").
  """

  def call(self, inputs, mask=None):
    rank = inputs.shape.rank
    if mask is not None or self.axis % rank != rank - 1:
      return super().call(inputs, mask)
    channels = inputs.shape[-1]
    groups = self.groups
    shape = tf.shape(inputs)
    grouped = tf.reshape(inputs, tf.concat([shape[:-1], [groups, channels // groups]], axis=0))
    # Standardized over everything but the batch and the group axes, then each channel scaled and
    # shifted: one function whose gradient is written out (`standardize`).
    axes = list(range(1, rank - 1)) + [rank]
    param_shape = [groups, channels // groups]
    if not (self.scale and self.center):
      out = standardize(grouped, axes, self.epsilon)
      if self.scale:
        out = out * tf.reshape(self.gamma, param_shape)
      if self.center:
        out = out + tf.reshape(self.beta, param_shape)
      return tf.reshape(out, shape)
    epsilon, outer = self.epsilon, list(range(rank - 1))
    recorded = recording_active()  # x_hat as a second output, which the weights' gradient multiplies.
    out = _group_normalize(grouped, self.gamma, self.beta, axes, outer, param_shape, channels,
                           epsilon, with_x_hat=recorded)
    if recorded:
      out, x_hat = out
      _record(self, "group_norm", x_hat, out, gamma=self.gamma, beta=self.beta)
    return tf.reshape(out, shape)


def _group_normalize(grouped, gamma, beta, axes, outer, param_shape, channels, epsilon,
                     with_x_hat: bool = False):
  """`GroupNormalization.call`'s normalization with its gradient written out; `with_x_hat`: also
  x_hat, a second output no gradient flows through (a `recording` reads it)."""

  @tf.custom_gradient
  def normalize(grouped, gamma, beta):
    centered = grouped - tf.reduce_mean(grouped, axes, keepdims=True)
    inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axes, keepdims=True) + epsilon)
    x_hat = centered * inv
    gamma = tf.reshape(gamma, param_shape)

    def grad(g, *unused_x_hat_gradient):
      del unused_x_hat_gradient
      g_hat = g * gamma
      dx = inv * (g_hat - tf.reduce_mean(g_hat, axes, keepdims=True)
                  - x_hat * tf.reduce_mean(g_hat * x_hat, axes, keepdims=True))
      return (dx, tf.reshape(tf.reduce_sum(g * x_hat, outer), [channels]),
              tf.reshape(tf.reduce_sum(g, outer), [channels]))
    y = x_hat * gamma + tf.reshape(beta, param_shape)
    return ((y, tf.identity(x_hat)) if with_x_hat else y), grad

  return normalize(grouped, gamma, beta)


def group_norm(channels: int, name: str | None = None,
               min_group_size: int = 1) -> tf.keras.layers.Layer:
  """GroupNorm over the last axis. On feature maps a one-channel group still normalizes over space;
  on vectors ([B, C], the MLP heads) it would zero everything, so heads ask for groups of >= 4."""
  return GroupNormalization(
      groups=num_groups(channels, min_group_size=min_group_size), epsilon=1e-5, name=name)


_segments = threading.local()


@contextlib.contextmanager
def batch_segments(count: int):
  """Within it, a `BatchStatNormalization` layer splits its batch into `count` equal, consecutive
  segments and normalizes each by its own statistics: a forward pass over several views stacked on
  the batch axis ([view 1; view 2]) normalizes each view over its own images, as separate passes
  would (the published BYOL, SimSiam and MoCo v3 code forwards each view on its own)."""
  if count < 1:
    raise ValueError(f"batch segments must be >= 1; got {count}")
  previous = getattr(_segments, "count", 1)
  _segments.count = count
  try:
    yield
  finally:
    _segments.count = previous


class BatchStatNormalization(tf.keras.layers.Layer):
  """BatchNorm as it trains, always: each feature standardized over the (segment of the) batch it is
  called on, then scaled and shifted (`affine`), in training and inference alike. It keeps no moving
  statistics, so it has no state to aggregate across clients or to save: the SSL heads that use it are
  dropped before the encoder is evaluated. Inputs [B, D]; B a multiple of the active
  `batch_segments`, each segment of at least 2 rows for statistics to exist."""

  normalizes = True  # FunctionalModel: its weights are a normalization layer's (LARS, masks).

  def __init__(self, affine: bool = True, epsilon: float = 1e-5, **kwargs):
    super().__init__(**kwargs)
    self.affine = affine
    self.epsilon = epsilon

  def build(self, input_shape):
    dim = int(input_shape[-1])
    if self.affine:
      self.gamma = self.add_weight(name="gamma", shape=(dim,), initializer="ones")
      self.beta = self.add_weight(name="beta", shape=(dim,), initializer="zeros")
    super().build(input_shape)

  def call(self, inputs):
    count = getattr(_segments, "count", 1)
    dim = inputs.shape[-1]
    x = tf.reshape(inputs, [count, -1, dim])
    mean, variance = tf.nn.moments(x, axes=[1], keepdims=True)
    x = tf.reshape((x - mean) * tf.math.rsqrt(variance + self.epsilon), tf.shape(inputs))
    return x * self.gamma + self.beta if self.affine else x

  def get_config(self):
    return {**super().get_config(), "affine": self.affine, "epsilon": self.epsilon}
