"""Named, frozen experiment configurations: `bin/train --task=NAME` runs one, flags override fields."""

from __future__ import annotations

from tff_ssl.experiment import ExperimentConfig

TASKS: dict[str, ExperimentConfig] = {
    # The README's main command: short centralized CCO pretraining on Fashion-MNIST (Debian's files),
    # then a linear probe on 10% of the labels, next to the same encoder at random initialization.
    "fmnist_centralized_demo": ExperimentConfig(
        method="centralized", ssl="cco", dataset="fashion_mnist", encoder="resnet14", width=1.0,
        projector=(512, 512, 512), steps=300, batch_size=256, optimizer="adam",
        learning_rate=2e-3, crop_min_scale=0.2, blur=False, eval_label_fraction=0.1,
        eval_steps=500, seed=0),
    # The README's main command: federated DCCO on Fashion-MNIST, non-IID (alpha = 0: every client
    # holds one class), 3,750 clients of 16 images, 16 clients per round (global batch 256, as the
    # centralized demo), 100 rounds; then the linear probe against random initialization.
    "fmnist_dcco_demo": ExperimentConfig(
        method="dcco", dataset="fashion_mnist", encoder="resnet14", width=1.0,
        projector=(512, 512, 512), rounds=100, num_clients=3750, samples_per_client=16, alpha=0.0,
        clients_per_round=16, local_steps=1, client_learning_rate=1.0, server_optimizer="adam",
        server_learning_rate=2e-3, crop_min_scale=0.2, blur=False, eval_label_fraction=0.1,
        eval_steps=500, seed=0),
    # Cross-device scale: 50,000 one-image clients, 512 per round (the memory check of the grouped
    # simulation; resources.csv holds the per-round memory).
    "fmnist_dcco_50k_clients": ExperimentConfig(
        method="dcco", dataset="fashion_mnist", encoder="resnet14", width=1.0,
        projector=(512, 512, 512), rounds=20, num_clients=50000, samples_per_client=1, alpha=0.0,
        clients_per_round=512, local_steps=1, client_learning_rate=1.0, server_optimizer="adam",
        server_learning_rate=2e-3, crop_min_scale=0.2, blur=False, eval_label_fraction=0.1,
        eval_steps=500, checkpoint_every=10, seed=0),
    "synthetic_dcco_smoke": ExperimentConfig(
        method="dcco", dataset="synthetic", encoder="resnet8", width=0.5, projector=(32, 32, 32),
        rounds=2, num_clients=200, samples_per_client=1, alpha=0.0, clients_per_round=8,
        eval_steps=20, seed=0),
    # Seconds-long run on synthetic images: smoke tests and trying flags.
    "synthetic_smoke": ExperimentConfig(
        method="centralized", ssl="cco", dataset="synthetic", encoder="resnet8", width=0.5,
        projector=(32, 32, 32), steps=3, batch_size=32, eval_steps=20, log_every=1, seed=0),
}


def get_task(name: str) -> ExperimentConfig:
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
  return TASKS[name]


# Paper tables (`bin/reproduce --table=NAME --scale=SCALE`): name -> scale -> Table factory.
from tasks import centralized_gate, centralized_gate_vit, dcco_table1, fedema_table3, fedfoa_table, fedx_fedu2_regime, fedx_table, ldawa_table2, lwfedssl_table, mini_regime, privacy_levers_table, privacy_scaling_table, privacy_table, statistics_table  # noqa: E402  pylint: disable=g-import-not-at-top

TABLES = {dcco_table1.NAME: dcco_table1.SCALES, ldawa_table2.NAME: ldawa_table2.SCALES,
          ldawa_table2.COLLAPSE_NAME: ldawa_table2.COLLAPSE_SCALES,
          fedema_table3.NAME: fedema_table3.SCALES, lwfedssl_table.NAME: lwfedssl_table.SCALES,
          fedfoa_table.NAME: fedfoa_table.SCALES, mini_regime.NAME: mini_regime.SCALES,
          centralized_gate.NAME: centralized_gate.SCALES,
          centralized_gate_vit.NAME: centralized_gate_vit.SCALES,
          privacy_table.NAME: privacy_table.SCALES, statistics_table.NAME: statistics_table.SCALES,
          privacy_scaling_table.NAME: privacy_scaling_table.SCALES, fedx_table.NAME: fedx_table.SCALES,
          fedx_fedu2_regime.NAME: fedx_fedu2_regime.SCALES,
          privacy_levers_table.NAME: privacy_levers_table.SCALES}


def get_table(name: str, scale: str):
  """The `tff_ssl.tables.Table` `name` at `scale` ("mini" or "paper")."""
  if name not in TABLES:
    raise ValueError(f"unknown table {name!r}; choose one of {sorted(TABLES)}")
  if scale not in TABLES[name]:
    raise ValueError(f"table {name!r} has no scale {scale!r}; choose one of {sorted(TABLES[name])}")
  return TABLES[name][scale]()
