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


def test_the_regime_table_checks_both_papers_claims_at_three_seeds():
  """FedX's and FedU²'s rows in the mini regime (tasks/fedx_fedu2_regime.py): each paper's rows in its
  own non-IID split and IID, every claim of each at three seeds, the same pilot budget for every row."""
  table = tasks.get_table("fedx_fedu2_regime", "mini")
  assert {c.key: c.alpha for c in table.columns} == {"dir05": 0.5, "dir01": 0.1, "iid": 1000.0}
  c = table.cell_config(table.row("fedu2"), table.column("dir01"))
  assert (c.fedu2_fur, c.fedu2_eua, c.dataset, c.num_clients) == (True, True,
                                                                  "fashion_mnist_shifted", 10)
  assert {len(r.learning_rates) for r in table.rows} == {3}  # Equal pilots.
  fedx = [cl for cl in table.claims if cl.better.endswith("_fedx")]
  fedu2 = [cl for cl in table.claims if not cl.better.endswith("_fedx")]
  assert len(fedx) == 6 and {cl.columns for cl in fedx} == {("dir05", "iid")}
  assert len(fedu2) == 7 and {cl.columns for cl in fedu2} == {("dir01", "iid")}
  todo, _ = reproduce.cells(table)
  own = [cell for cell in todo if cell.seed is None]
  assert len(todo) == len(own) + 2 * len(table.claim_cells())
