"""--precision=mixed_bfloat16: convolutions and dense layers multiply bfloat16 operands, everything
else (weights, normalization, gradients' dtype, losses) stays float32."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import models
from tff_ssl.benchmarks import common as bench_common
from tff_ssl.benchmarks import rounds
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import ssl_model
from tff_ssl.models import layers

BF16_EPS = 2.0 ** -8  # bfloat16 keeps 8 significant bits: relative rounding error <= 2^-8.


def _round_bf16(x):
  return tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()


def test_layers_multiply_the_bfloat16_rounding_of_their_operands():
  """A convolution and a dense layer built in the scope equal the float32 product of the
  bfloat16-rounded input and weight, itself rounded to bfloat16 (oneDNN accumulates in float32): one
  bfloat16 rounding of the result apart, where the float32 layers differ by the operands' rounding."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 9, 5)).astype(np.float32)
  v = rng.normal(size=(4, 12)).astype(np.float32)
  with layers.precision("mixed_bfloat16"):
    conv = layers.Conv2D(7, 3, padding="same", use_bias=False)
    dense = layers.Dense(6, use_bias=True, bias_initializer="ones")
  assert conv.precision == dense.precision == "mixed_bfloat16"
  assert layers.current_precision() == "float32"  # The scope ends with its block.
  y, z = conv(x), dense(v)
  assert y.dtype == z.dtype == tf.float32 and conv.kernel.dtype == tf.float32
  y_ref = tf.nn.conv2d(_round_bf16(x), _round_bf16(conv.kernel), 1, "SAME").numpy()
  z_ref = _round_bf16(v) @ _round_bf16(dense.kernel)
  # One bfloat16 rounding of the product apart (relative 2^-8 to 2^-7: one unit in its last place,
  # as a CPU without BF16 instructions, whose oneDNN emulates them, may round; seen on Zen 3).
  product = z.numpy() - 1.0  # The float32 bias added to a bfloat16 product: exact either way.
  np.testing.assert_allclose(y.numpy(), _round_bf16(y_ref), rtol=2.01 * BF16_EPS, atol=1e-6)
  np.testing.assert_allclose(product, _round_bf16(z_ref), rtol=2.01 * BF16_EPS, atol=1e-6)
  # Every value is a bfloat16 number (before the float32 bias): the product was not float32.
  np.testing.assert_array_equal(y.numpy(), _round_bf16(y.numpy()))
  np.testing.assert_array_equal(product, _round_bf16(product))
  # The float32 layer with the same weights is the unrounded product.
  plain = layers.Conv2D(7, 3, padding="same", use_bias=False)
  plain.build(x.shape)
  plain.kernel.assign(conv.kernel)
  np.testing.assert_allclose(plain(x).numpy(), tf.nn.conv2d(x, conv.kernel, 1, "SAME").numpy(),
                             rtol=1e-5, atol=1e-5)
  assert plain.precision == "float32" and conv.get_config()["precision"] == "mixed_bfloat16"


def test_a_ws_resnet_and_its_heads_in_bfloat16_keep_float32_weights_and_gradients():
  tf.keras.utils.set_random_seed(0)
  config = ExperimentConfig(method="fedavg", precision="mixed_bfloat16", projector=(32, 16))
  model = ssl_model.ssl_model_builder(config, (28, 28, 1))()
  multiplying = [l for l in model.submodules if isinstance(l, (layers.Conv2D, layers.Dense))]
  assert len(multiplying) == 15 + 2  # ResNet-14's convolutions, the projector's dense layers.
  assert all(l.precision == "mixed_bfloat16" for l in multiplying)
  x = tf.random.stateless_uniform([3, 28, 28, 1], [0, 1])
  with tf.GradientTape() as tape:
    z = model(x, training=True)
    loss = tf.reduce_sum(tf.sin(z))
  grads = tape.gradient(loss, model.trainable_variables)
  assert z.dtype == tf.float32 and all(v.dtype == tf.float32 for v in model.weights)
  assert all(g.dtype == tf.float32 and np.all(np.isfinite(g.numpy())) for g in grads)
  # The float32 model of the same seed: the same function, up to bfloat16 rounding.
  tf.keras.utils.set_random_seed(0)
  plain = ssl_model.ssl_model_builder(ExperimentConfig(method="fedavg", projector=(32, 16)),
                                      (28, 28, 1))()
  z32 = plain(x, training=True).numpy()
  assert 0 < np.abs(z.numpy() - z32).max() < 0.05 * np.abs(z32).max()


def test_precision_refusals_and_the_emulation_warning(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match="precision"):
    ExperimentConfig(precision="float16")
  with pytest.raises(ValueError, match="would still attend in float32"):
    ExperimentConfig(encoder="vit_mini", precision="mixed_bfloat16")
  with pytest.raises(ValueError, match="unknown precision 'half'"):
    with layers.precision("half"):
      pass
  native = tmp_path / "amx"
  native.write_text("processor : 0\nflags : fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
  emulated = tmp_path / "avx2"
  emulated.write_text("processor : 0\nflags : fpu avx2 fma\n")
  monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
  assert layers.native_bfloat16(str(native)) and not layers.native_bfloat16(str(emulated))
  monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # oneDNN capped below BF16.
  assert not layers.native_bfloat16(str(native))
  monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
  assert "emulated" in layers.bfloat16_warning("mixed_bfloat16")
  assert layers.bfloat16_warning("float32") is None


def test_benchmark_times_a_scenario_in_both_precisions_and_xla():
  """bin/benchmark --precisions=float32,mixed_bfloat16 --xla, in process on the tiny model (the
  grouped round only): each row carries its precision and the XLA step; speed-ups are ratios."""
  images = np.random.default_rng(0).integers(0, 255, size=(256, 28, 28, 1), dtype=np.uint8)
  scenario = bench_common.SCENARIOS["fedavg_cco_32x4"]
  builder = bench_common.MODELS["tiny"]((28, 28, 1))
  rows = [rounds.run_scenario(scenario, images, builder, warmup=1, rounds=1, modes=("grouped",),
                              precision=p, xla=True, log=lambda s: None)
          for p in ("float32", "mixed_bfloat16")]
  assert [r["precision"] for r in rows] == ["float32", "mixed_bfloat16"]
  for r in rows:
    assert r["grouped_s"] > 0 and r["baseline_s"] > 0 and r["baseline_xla_s"] > 0
    assert math.isnan(r["reference_s"])
  table = rounds.format_speedups(rows)
  expected = rows[0]["grouped_s"] / rows[1]["grouped_s"]
  assert f"| fedavg_cco_32x4 | mixed_bfloat16 | nanx | {expected:.2f}x |" in table


def test_speedups_are_the_base_precisions_time_over_each_ones():
  nan = float("nan")
  row = lambda p, g, b, x: {"scenario": "s", "precision": p, "reference_s": nan,  # noqa: E731
                            "grouped_s": g, "baseline_s": b, "baseline_xla_s": x}
  table = rounds.format_speedups([row("float32", 3.0, 2.0, 4.0), row("mixed_bfloat16", 1.5, 0.5, nan)])
  assert table.splitlines()[2:] == ["| s | float32 | nanx | 1.00x | 1.00x | 0.50x |",
                                    "| s | mixed_bfloat16 | nanx | 2.00x | 4.00x | nanx |"]
  assert rounds.format_speedups([row("float32", 3.0, 2.0, nan)]) == ""
  with pytest.raises(ValueError, match="precision"):
    bench_common.with_precision(lambda: None, "int8")


def test_step_profile_reads_the_ops_of_the_step_from_tf_profiler():
  """bin/benchmark --step_profile, in process on the tiny model: the op table's kinds add up to its
  total, and the step's own convolutions (forward and both backward passes) are in it."""
  from tff_ssl.benchmarks import step_profile  # pylint: disable=g-import-not-at-top
  assert [step_profile.kind(t) for t in ("_MklNativeConv2DBackpropFilter", "Conv2D", "_MklMatMul",
                                         "BatchMatMulV2", "Cast", "Mean")] == [
      "convolution", "convolution", "matmul", "matmul", "cast", "other"]
  images = np.random.default_rng(0).integers(0, 255, size=(16, 28, 28, 1), dtype=np.uint8)
  builder = bench_common.MODELS["tiny"]((28, 28, 1))
  rows = [step_profile.profile_step(images, builder, precision=p, repeats=1, profiled=1)
          for p in ("float32", "mixed_bfloat16")]
  for row in rows:
    assert row["batch"] == 16 and row["step_s"] > 0 and row["convolution_ms"] > 0
    parts = sum(row[f"{k}_ms"] for k in ("convolution", "matmul", "cast", "other"))
    assert abs(parts - row["op_ms"]) <= 1e-9 * row["op_ms"]
  assert "Conv2DBackpropFilter" in rows[0]["top_ops"] + rows[1]["top_ops"]
  table = step_profile.format_profile(rows)
  assert table.splitlines()[0] == "| ms a step | float32 | mixed_bfloat16 |"
