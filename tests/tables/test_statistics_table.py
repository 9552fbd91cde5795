"""The statistics-losses table as data: its grid (each loss's DCCO row beside its centralized row, and
one-computation DCCO) and its checks on hand-made results."""

import pytest

import tasks
from tasks import statistics_table
from tests.tables import gates
from tff_ssl import reproduce


SSL = {"dcco": "cco", "dcco_previous": "cco", "dcco_vicreg": "vicreg", "dcco_spectral": "spectral",
       "centralized_cco": "cco", "centralized_vicreg": "vicreg", "centralized_spectral": "spectral"}


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_grid(scale):
  table = tasks.get_table("dcco_statistics", scale)
  assert [c.key for c in table.columns] == ["noniid_1", "noniid_16"]
  todo, skipped = reproduce.cells(table)
  assert not skipped and len(todo) == 11  # 4 federated rows x 2 columns, 3 centralized rows.
  batch = 128 if scale == "mini" else 512
  for cell in todo:
    c = table.cell_config(cell.row, cell.column)
    assert c.ssl == SSL[cell.row.key]
    if cell.row.federated:
      assert (c.method, c.partition, c.alpha, c.local_steps) == ("dcco", "dirichlet", 0.0, 1)
      assert c.samples_per_client * c.clients_per_round == batch
      assert c.dcco_statistics == ("previous" if cell.row.key == "dcco_previous" else "current")
    else:  # One step of a round's images per round, at the federated rows' learning rate.
      assert (c.method, c.steps, c.batch_size) == ("centralized", table.row("dcco").config.rounds,
                                                   batch)
      assert c.learning_rate == table.row("dcco").config.server_learning_rate
    if scale == "mini":
      assert c.dataset == "fashion_mnist_shifted" and c.pool_grid == 2


def _records(accuracy):
  """Two label seeds of each cell, the second 1 point above the first."""
  return [{"evaluation": k, "row": row, "column": column, "ours": a + (0.01 if k.endswith("s1")
                                                                      else 0.0)}
          for (row, column), a in accuracy.items() for k in ("tuned_10_s0", "tuned_10_s1")]


def test_checks_state_each_gap_to_the_centralized_row_and_the_stale_statistics_cost():
  table = tasks.get_table("dcco_statistics", "mini")
  accuracy = {("centralized_cco", ""): 0.70, ("centralized_vicreg", ""): 0.72,
              ("centralized_spectral", ""): 0.66}
  for column in ("noniid_1", "noniid_16"):
    accuracy.update({("dcco", column): 0.69, ("dcco_previous", column): 0.675,
                     ("dcco_vicreg", column): 0.65, ("dcco_spectral", column): 0.655})
  records = _records(accuracy)
  lines = statistics_table.checks(table, records, gates.passing(records))
  assert any(l.startswith("non-IID 60,000 / 1 / 128: Centralized CCO − DCCO (CCO) = +1.0 / +1.0 "
                          "points, within 3 — holds") for l in lines), lines
  assert any("Centralized VICReg − DCCO-VICReg = +7.0 / +7.0 points, within 3 — **fails**" in l
             for l in lines), lines
  assert any("Centralized spectral − DCCO-spectral = +0.5 / +0.5" in l and "holds" in l
             for l in lines), lines
  stale = [l for l in lines if l.startswith("stale statistics")]
  assert len(stale) == 2 and all("(-1.5 / -1.5 points)" in l and "**fails**" in l for l in stale)
  # A cell short of the gate leaves its comparison untested.
  gate = gates.passing(records, but=[("dcco_vicreg", "noniid_16")])
  lines = statistics_table.checks(table, records, gate)
  assert any("non-IID 3,750 / 16 / 8: Centralized VICReg" in l and "untested" in l for l in lines)
