"""The FedX table (tasks/fedx_table.py) as data: FedX's setting at both scales, its rows, the paper's
numbers and claims, and three training seeds for every row the claims compare."""

import pytest

import tasks
from tff_ssl import reproduce


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_fedx_setting_rows_claims_and_seeds(scale):
  table = tasks.get_table("fedx", scale)
  assert [r.key for r in table.rows] == ["fedsimclr", "fedsimclr_fedx", "fedbyol", "fedbyol_fedx",
                                         "fedu", "fedu_fedx"]
  for row in table.rows:
    c = table.cell_config(row, table.columns[0])
    assert (c.partition, c.alpha, c.num_clients, c.clients_per_round, c.local_batch_size) == (
        "dirichlet_split", 0.5, 10, 10, 64)
    assert (c.client_optimizer, c.client_learning_rate, c.client_weight_decay) == ("sgdm", 0.01,
                                                                                  1e-5)
    assert c.fedx == row.key.endswith("_fedx") and c.dataset == "fashion_mnist"
    assert (c.rounds, c.local_steps) == ((100, 10) if scale == "paper" else (100, 1))
    assert c.has_predictor == (c.fedx or c.ssl == "byol")  # FedX gives SimCLR a predictor.
  assert table.paper[("fedx_linear", "fedsimclr_fedx", "fashion_mnist")] == 81.98
  # Each FedX row above its base, and by at least the abstract's smallest gain.
  assert [(c.better, c.base, c.relation) for c in table.claims] == [
      (f"{b}_fedx", b, rel) for b in ("fedsimclr", "fedbyol", "fedu") for rel in ("above", "by")]
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == 6 * len(table.columns) * 3
  assert table.seeds == (0, 1, 2) and table.tie == 1.0
