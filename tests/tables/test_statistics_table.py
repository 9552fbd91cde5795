"""The statistics-losses table as data: its grid (each loss's DCCO row beside its centralized row, and
one-computation DCCO) and its checks on hand-made results."""

import pytest

import tasks
from tasks import statistics_table
from tests.tables import gates
from tff_ssl import reproduce, table_report


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


def test_claims_state_each_gap_to_the_centralized_row_and_the_stale_statistics_cost():
  table = tasks.get_table("dcco_statistics", "mini")
  accuracy = {("centralized_cco", ""): 0.70, ("centralized_vicreg", ""): 0.72,
              ("centralized_spectral", ""): 0.66}
  for column in ("noniid_1", "noniid_16"):
    accuracy.update({("dcco", column): 0.69, ("dcco_previous", column): 0.675,
                     ("dcco_vicreg", column): 0.65, ("dcco_spectral", column): 0.655})
  del accuracy[("dcco_previous", "noniid_16")]
  records = _records(accuracy)
  records += [{"evaluation": k, "row": "dcco_previous", "column": "noniid_16", "ours": None,
               "status": "FAILED: round 123: loss became nan; lower --server_learning_rate"}
              for k in ("tuned_10_s0", "tuned_10_s1")]
  lines = table_report.claim_lines(table, records, gates.passing(records))
  assert ("[1] non-IID 60,000 / 1 / 128: DCCO (CCO) 69.0 / 70.0 is within 3 points of Centralized "
          "CCO 70.0 / 71.0 (-1.0 / -1.0 points) — holds") in lines
  assert any("DCCO-VICReg 65.0 / 66.0 is within 3 points of Centralized VICReg 72.0 / 73.0 "
             "(-7.0 / -7.0 points) — **fails**" in l for l in lines), lines
  assert any("DCCO-spectral 65.5 / 66.5 is within 3 points of Centralized spectral" in l and
             l.endswith("holds") for l in lines), lines
  stale = [l for l in lines if l.startswith("[5]")]
  assert stale == [
      "[5] non-IID 60,000 / 1 / 128: One-computation DCCO (CCO, previous statistics) 67.5 / 68.5 "
      "is within 1 points of DCCO (CCO) 69.0 / 70.0 (-1.5 / -1.5 points) — **fails**",
      # A failed cell: the claim stays, untested, with the failure's reason.
      "[5] non-IID 3,750 / 16 / 8: One-computation DCCO (CCO, previous statistics) is within 1 "
      "points of DCCO (CCO) — untested: One-computation DCCO (CCO, previous statistics), non-IID "
      "3,750 / 16 / 8 failed (round 123: loss became nan)"]
  # A cell short of the gate leaves its comparison untested.
  gate = gates.passing(records, but=[("dcco_vicreg", "noniid_16")])
  lines = table_report.claim_lines(table, records, gate)
  assert any("non-IID 3,750 / 16 / 8: DCCO-VICReg" in l and "untested" in l for l in lines)

def test_a_claim_whose_cell_failed_is_printed_untested_with_the_reason(tmp_path):
  """table.md keeps every comparison: a failed cell's reads "untested: <cell> failed (<reason>)"
  (the stale-statistics check once vanished from the report when its cells had failed)."""
  table = tasks.get_table("dcco_statistics", "mini")
  todo, skipped = reproduce.cells(table)
  results = {}
  for cell in todo:
    if cell.row.key == "dcco_previous":
      results[cell.path] = {"failed": "round 125: loss became nan; lower --server_learning_rate "
                                      "(now 0.005) in a new --output_dir"}
    else:
      results[cell.path] = {"linear_probe_accuracy_pretrained": 0.7,
                            "evaluations": {"tuned_10_s0": 0.70, "tuned_10_s1": 0.71}}
  baselines = {k: {"raw_pixels": 0.64, "random_init": 0.36} for k in ("tuned_10_s0", "tuned_10_s1")}
  out = table_report.write(table, str(tmp_path), todo, skipped, results, {}, None,
                           {"runs": {}, "invocations": []}, baselines)
  md = open(out["table_md"]).read()
  for column in ("non-IID 60,000 / 1 / 128", "non-IID 3,750 / 16 / 8"):
    assert (f"{column}: One-computation DCCO (CCO, previous statistics) is within 1 points of DCCO "
            f"(CCO) — untested: One-computation DCCO (CCO, previous statistics), {column} failed "
            f"(round 125: loss became nan)") in md
