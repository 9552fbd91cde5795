"""Bytes of TFF types and graph FLOPs against hand counts; peak memory against tensors of known
size."""

import collections
import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import lwfedssl_table
from tff_ssl import cost, models
from tff_ssl.benchmarks import layerwise_cost


def test_message_bytes_of_a_model_type_by_hand():
  weights = tff.types.to_type([tff.TensorType(np.float32, [3, 4]), tff.TensorType(np.float32, [4])])
  assert cost.message_bytes(weights) == (12 + 4) * 4
  placed = tff.FederatedType(collections.OrderedDict(w=weights, n=tff.TensorType(np.int64)),
                             tff.CLIENTS)
  assert cost.message_bytes(placed) == 64 + 8
  with pytest.raises(ValueError, match="unknown shape"):
    cost.message_bytes(tff.TensorType(np.float32, [None, 3]))


def test_matmul_and_einsum_flops_by_hand():
  specs = (tf.TensorSpec([2, 3, 4]), tf.TensorSpec([2, 4, 5]))
  want = 2 * 2 * 3 * 4 * 5
  assert cost.graph_flops(lambda a, b: tf.matmul(a, b), specs) == (want, [])
  assert cost.graph_flops(lambda a, b: tf.einsum("bij,bjk->bik", a, b), specs) == (want, [])
  # No index summed over: one multiplication per element of the product.
  assert cost.graph_flops(lambda a, b: tf.einsum("ij,ij->ij", a, b),
                          (tf.TensorSpec([3, 4]),) * 2)[0] == 12


def test_a_vit_block_is_counted_with_its_attention():
  """One ViT block on 17 tokens of dim 48 (3 heads): the four projections, the two attention
  einsums and the MLP, counted by hand; the elementwise math TF does not count is named."""
  enc = models.build_encoder("vit_mini", (28, 28, 1), width=0.5, depth=1, patch_size=7)
  tokens, dim, hidden, batch = 17, 48, 96, 2
  flops, uncounted = cost.graph_flops(lambda x: enc(x), [tf.TensorSpec([batch, 28, 28, 1])])
  matmuls = batch * (2 * 16 * 49 * dim  # Patch embedding: 16 patches of 7x7.
                     + 4 * 2 * tokens * dim * dim  # Query, key, value, output.
                     + 2 * 2 * tokens * tokens * dim  # Scores and the weighted sum.
                     + 2 * 2 * tokens * dim * hidden)  # MLP.
  assert matmuls <= flops <= 1.1 * matmuls  # The rest: biases, norms, softmax, residual adds.
  assert "Erf" in uncounted or "Gelu" in uncounted  # GELU is not counted by TF; it is named.


def test_local_step_cost_of_layerwise_and_progressive_stages():
  """Stage 2 of a 2-block ViT: layer-wise uploads block 2 and the heads (bytes by hand from the
  shapes) and computes less than progressive (no backward through block 1)."""
  from tff_ssl.experiment import ExperimentConfig  # pylint: disable=g-import-not-at-top
  from tff_ssl import runner  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated import masks  # pylint: disable=g-import-not-at-top
  from tff_ssl.methods import fedavg, layerwise  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated.functional import FunctionalModel  # pylint: disable=g-import-not-at-top
  cfg = ExperimentConfig(method="fedavg", ssl="mocov3", encoder="vit_mini", patch_size=7, depth=2,
                         width=0.5, projector=(32, 16), predictor=(32, 16), temperature=0.2)
  model = FunctionalModel(runner.ssl_model_builder(cfg, (28, 28, 1)))
  fedavg_config = fedavg.process_config(cfg)[0]
  images = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 1), dtype=np.uint8)
  out = {}
  for schedule in ("layerwise", "progressive"):
    mask = masks.TensorMask.from_names(model.names, lambda n, s=schedule: layerwise.trained(n, 2, s))
    out[schedule] = cost.local_step_cost(model, mask, fedavg_config, images)
  total = sum(int(np.prod(s.shape)) * 4 for s in model.weight_specs)
  block2_and_heads = sum(int(np.prod(s.shape)) * 4 for n, s in zip(model.names, model.weight_specs)
                         if layerwise.block_of(n) in (0, 2))
  assert out["layerwise"]["upload_bytes"] == block2_and_heads
  assert out["progressive"]["upload_bytes"] == out["progressive"]["download_bytes"] == total
  assert out["layerwise"]["step_flops"] < out["progressive"]["step_flops"]


def test_layerwise_cost_table():
  """bin/benchmark --layerwise's rows on a 2-block ViT: end-to-end is the reference; Prog-FedSSL's
  last stage is the end-to-end step exactly (the same model and tensors); FedMoCo-LW uploads less
  and computes less from stage 2 on; LW-FedSSL uploads what FedMoCo-LW does, downloads the whole
  stage model (calibrated on the server) and computes more (the global encoder's forward pass);
  FLL + DD's stage-2 FLOPs are the mean of the graphs with block 1 kept and skipped."""
  # The table's rows, small: batch 4 (FLL + DD half of it, as in the table).
  small = [(name, dataclasses.replace(c, depth=2, width=0.5, projector=(16, 8), predictor=(16, 8),
                                      local_batch_size=c.local_batch_size // 32))
           for name, c in layerwise_cost.table_rows(lwfedssl_table.mini())]
  rows = layerwise_cost.layerwise_costs(small)
  by = {(r["method"], r["stage"]): r for r in rows}
  assert len(rows) == 10
  e2e, prog, lw = (by[("FedMoCo", 2)], by[("Prog-FedSSL", 2)], by[("FedMoCo-LW", 2)])
  lwf, dd = by[("LW-FedSSL", 2)], by[("FLL + DD", 2)]
  assert (prog["step_flops"], prog["upload_bytes"]) == (e2e["step_flops"], e2e["upload_bytes"])
  assert lw["upload_bytes"] < e2e["upload_bytes"] and lw["step_flops"] < e2e["step_flops"]
  assert by[("FedMoCo-LW", 1)]["step_flops"] == by[("Prog-FedSSL", 1)]["step_flops"]
  assert lw["kept_download_bytes"] == lw["upload_bytes"] < lw["download_bytes"]
  assert lwf["upload_bytes"] == lw["upload_bytes"]
  assert lwf["kept_download_bytes"] == lwf["download_bytes"] == e2e["download_bytes"]
  assert lwf["step_flops"] > lw["step_flops"]
  table = layerwise_cost.format_layerwise_table(rows)
  assert "| FedMoCo-LW | 2 |" in table and "FLL + DD: 2" in table  # Its half batch.
  totals = {t["method"]: t for t in layerwise_cost.layerwise_totals(rows)}
  assert totals["FedMoCo"]["upload_bytes_lower"] == 1.0
  assert totals["FedMoCo-LW"]["upload_bytes"] == sum(by[("FedMoCo-LW", s)]["upload_bytes"]
                                                     for s in (1, 2))


def test_depth_dropout_flops_are_the_expectation_over_keep_patterns():
  from tff_ssl.experiment import ExperimentConfig  # pylint: disable=g-import-not-at-top
  from tff_ssl import runner  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated import masks  # pylint: disable=g-import-not-at-top
  from tff_ssl.methods import fedavg, layerwise  # pylint: disable=g-import-not-at-top
  from tff_ssl.federated.functional import FunctionalModel  # pylint: disable=g-import-not-at-top
  cfg = ExperimentConfig(method="fedavg", ssl="simclr", encoder="vit_mini", patch_size=7, depth=3,
                         width=0.5, projector=(16, 8), temperature=0.2)
  model = FunctionalModel(runner.ssl_model_builder(cfg, (28, 28, 1)))
  fcfg = fedavg.process_config(cfg)[0]
  images = np.random.default_rng(0).integers(0, 256, (4, 28, 28, 1), dtype=np.uint8)
  mask = masks.TensorMask.from_names(model.names, lambda n: layerwise.trained(n, 3, "layerwise"))
  flops = [cost.local_step_cost(model, mask, fcfg, images, keep=k)["step_flops"]
           for k in ((True, True), (False, True), (True, False), (False, False))]
  # A frozen block's forward pass costs the same whichever it is, and nothing when skipped.
  assert flops[1] == flops[2] and flops[0] - flops[1] == flops[1] - flops[3] > 0


def test_peak_memory_measures_what_a_call_holds_at_once(tmp_path):
  """In a fresh Python with `cost.MEASURING_ENV`: a function that holds two 8 MB tensors at once
  peaks at 16 MB or more, 7 MB more than one that holds one at a time; without the environment, an
  error that names it."""
  script = tmp_path / "probe.py"
  script.write_text(textwrap.dedent("""
      import tensorflow as tf
      from tff_ssl import cost
      n = 2 * 2**20  # 8 MB of float32.
      @tf.function
      def together(x):
        a = tf.random.stateless_uniform([n], [0, 1]) + x
        b = tf.random.stateless_uniform([n], [0, 2]) + x
        return tf.reduce_sum(a * b)
      @tf.function
      def alone(x):
        return tf.reduce_sum(tf.random.stateless_uniform([n], [0, 1]) + x)
      print(cost.peak_memory(together, tf.constant(1.0)), cost.peak_memory(alone, tf.constant(1.0)))
      """))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3")
  for k in cost.MEASURING_ENV:
    env.pop(k, None)
  bad = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=900)
  assert bad.returncode != 0 and "MALLOC_MMAP_THRESHOLD_=65536 TF_ENABLE_ONEDNN_OPTS=0" in bad.stderr
  env.update(cost.MEASURING_ENV)
  ok = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                      timeout=900)
  assert ok.returncode == 0, ok.stderr[-2000:]
  together, alone = (int(x) for x in ok.stdout.split()[-2:])
  mb = 2**20
  assert 7.5 * mb <= alone <= 17 * mb and together >= alone + 7 * mb, (together, alone)
  assert together <= 26 * mb, together
