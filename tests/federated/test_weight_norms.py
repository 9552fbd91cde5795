"""`--measure_weight_norms`: after every round, each kernel's norm over its initial norm in
aggregation.csv (how an aggregation strategy changes the global model's scale: the measurement
behind the L-DAWA table's account of Barlow Twins' collapse)."""

import csv

import numpy as np
import pytest

from tff_ssl import experiment, runner
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import common


def test_kernel_norms_by_hand():
  names = ["encoder/stem_conv/kernel", "encoder/stem_gn/gamma", "projector/projector_dense1/kernel",
           "projector/projector_dense1/bias", "encoder/stage1_block1_conv1/kernel"]
  initial = [np.full((3, 3, 1, 2), 1.0), np.ones(2), np.array([[3.0, 4.0]]), np.zeros(2),
             np.full((2, 2), 2.0)]
  weights = [np.full((3, 3, 1, 2), 0.5), 2 * np.ones(2), np.array([[0.0, 10.0]]), np.ones(2),
             np.full((2, 2), 3.0)]
  out = common.kernel_norms(names, initial, weights)
  # Kernels only: ||0.5 * 1|| / ||1|| = 0.5, 10 / 5 = 2, 6 / 4 = 1.5; per kind the mean.
  assert out["kernel_norm"] == {"encoder/stem_conv/kernel": 0.5,
                                "projector/projector_dense1/kernel": 2.0,
                                "encoder/stage1_block1_conv1/kernel": 1.5}
  assert out["kernel_norm_conv"] == 1.0 and out["kernel_norm_dense"] == 2.0


def test_a_run_writes_the_global_models_kernel_norms_each_round(tmp_path):
  """An L-DAWA run of 2 rounds: its aggregation.csv's norms are those of the weights the same config
  reaches round by round (`runner.trajectory`), beside L-DAWA's deltas."""
  config = ExperimentConfig(
      method="fedavg", ssl="simclr", dataset="synthetic", encoder="resnet14", width=0.25,
      projector=(16, 8), rounds=2, num_clients=4, samples_per_client=4, clients_per_round=2,
      local_batch_size=2, local_steps=1, client_learning_rate=0.05, aggregator="ldawa",
      server_optimizer="sgd", server_learning_rate=1.0, server_lr_schedule="constant",
      measure_weight_norms=True, eval_steps=5, seed=0)
  out = tmp_path / "run"
  experiment.run(config, str(out), progress=False, random_init_baseline=False)
  rows = list(csv.DictReader(open(out / "aggregation.csv")))
  assert [r["round"] for r in rows] == ["0", "1"] and "layer_delta/encoder/stem_conv" in rows[0]
  train, _ = experiment.load_splits(config)
  for row, (r, model, weights, _) in zip(rows, runner.trajectory(config, train, 2)):
    want = common.kernel_norms(model.names, model.initial_weights, weights)
    kernels = [n for n in model.names if n.endswith("/kernel")]
    assert len(kernels) == 17  # 15 convolutions and the projector's 2 dense layers.
    for name in kernels:
      assert float(row[f"kernel_norm/{name}"]) == pytest.approx(float(want["kernel_norm"][name]),
                                                                rel=1e-5)
    assert float(row["kernel_norm_conv"]) == pytest.approx(float(want["kernel_norm_conv"]),
                                                           rel=1e-5)
  assert not ExperimentConfig().measure_weight_norms  # Off by default: no such columns.
