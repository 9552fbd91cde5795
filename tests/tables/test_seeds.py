"""Training seeds in a table (issue 72): the cells a claim compares run at every seed of `Table.seeds`
(their own folders, their own config seed), the others at their own seed alone; a claim's verdict is
`tff_ssl.verdicts`' rule on the paired differences against the table's tie margin, so differences
that straddle the margin give tie or inconclusive, never holds or fails."""

import dataclasses
import json

import pytest

from tasks import dcco_table1
from tff_ssl import evaluation, reproduce, table_report, tables

KEYS = ("s0", "s1")


def seeded_table(**kw):
  """DCCO Table 1's mini grid with two label-seed probes and one claim, DCCO above CCO + FedAvg in
  IID 8, at training seeds 0, 1, 2 and a tie margin of 0.5 points."""
  return dataclasses.replace(
      dcco_table1.mini(), evaluations=tuple(
          tables.Evaluation(k, f"tuned, seed {i}", evaluation.TunedLinearProbeConfig(seed=i))
          for i, k in enumerate(KEYS)),
      gate_evaluations=KEYS, claims=(tables.Claim("dcco", "fedavg_cco", "the paper",
                                                  columns=("iid_8",)),),
      **{"seeds": (0, 1, 2), "tie": 0.5, "tie_why": "the test's", **kw})


def test_the_claims_cells_run_at_every_seed_in_folders_of_their_own():
  table = seeded_table()
  todo, _ = reproduce.cells(table)
  extra = [c for c in todo if c.seed is not None]
  assert sorted(c.path for c in extra) == [
      "cells/dcco/iid_8_seed1", "cells/dcco/iid_8_seed2", "cells/fedavg_cco/iid_8_seed1",
      "cells/fedavg_cco/iid_8_seed2"]
  assert todo[-len(extra):] == extra  # After every row's own cells.
  for cell in extra:
    assert table.cell_config(cell.row, cell.column, seed=cell.seed).seed == cell.seed
  assert table.seeds_of(table.row("dcco"), "iid_4") == (0,)  # No claim there.
  assert len(todo) == len(reproduce.cells(dataclasses.replace(table, seeds=()))[0]) + 4


@pytest.mark.parametrize("bad,match", [
    (dict(seeds=(0,)), "seeds must be >= 2 distinct"),
    (dict(seeds=(0, 1, 1)), "seeds must be >= 2 distinct"),
    (dict(tie_why=""), "declares its tie margin"),
    (dict(tie=-1.0), "declares its tie margin")])
def test_seeds_need_a_declared_tie_margin(bad, match):
  with pytest.raises(ValueError, match=match):
    seeded_table(**bad)


def _check(per_seed_difference, seeds=(0, 1, 2)):
  """The claim's line where DCCO is `per_seed_difference[i]` points above CCO + FedAvg at training
  seed i (the same at both label seeds), both well above the baselines."""
  table = seeded_table()
  base = {s: 0.70 + 0.01 * s for s in seeds}
  accs = {}
  for k in KEYS:
    accs[(k, "fedavg_cco", "iid_8")] = dict(base)
    accs[(k, "dcco", "iid_8")] = {s: base[s] + d / 100 for s, d in zip(seeds, per_seed_difference)}
  records = [{"evaluation": k, "row": r, "column": "iid_8", "ours": accs[(k, r, "iid_8")][seeds[0]],
              "status": "ok"} for k in KEYS for r in ("dcco", "fedavg_cco")]
  g = table_report.gate(table, records, {k: {"raw_pixels": 0.6, "random_init": 0.3} for k in KEYS})
  [line] = table_report.claim_lines(table, records, g, accs)
  return line, table_report.verdict_of(line)


@pytest.mark.parametrize("differences,verdict", [
    ((2.0, 2.2, 1.8), "holds"),
    ((-2.0, -2.2, -1.8), "fails"),
    ((0.1, 0.2, 0.0), "tie"),  # Inside +-0.5: a tie, though every seed is above.
    ((0.2, 1.6, 0.9), "inconclusive"),  # Straddles +0.5.
    ((-0.4, 0.6, 0.1), "inconclusive"),  # Straddles both bounds.
])
def test_differences_straddling_the_tie_margin_are_not_holds_or_fails(differences, verdict):
  line, got = _check(differences)
  assert got == verdict, line
  assert "[IID 7,500 / 8 / 16] " not in line and line.startswith("[1] IID")
  assert "(n = 3)" in line


def test_the_interval_is_the_t_interval_of_the_per_seed_differences():
  line, _ = _check((1.0, 2.0, 3.0))
  # Mean 2, s = 1, t(0.95, 2) = 2.919986: 2 +- 1.686. Every seed is above, but the interval's low
  # end is inside the tie margin.
  assert line.endswith("DCCO is above CCO + FedAvg: +2.0 [+0.3, +3.7] (n = 3) points — "
                       "inconclusive"), line


def test_one_seed_is_untested_and_says_which_is_missing():
  line, got = _check((2.0,), seeds=(0,))
  assert got == "untested" and line.endswith("DCCO, IID 7,500 / 8 / 16 at training seed 1 not run "
                                             "yet"), line


def test_the_page_lists_each_claim_cells_seeds():
  table = seeded_table()
  accs = {("s0", "dcco", "iid_8"): {0: 0.75, 2: 0.7712}}
  text = table_report._seeds_section(table, accs)
  assert "| DCCO, IID 7,500 / 8 / 16 | 75.0 | … | 77.1 |" in text
  tally = table_report.claim_tally(table, [], table_report.gate(table, [], {}),
                                   ["[1] x: A is above B: +0.1 [-0.2, +0.4] (n = 3) points — tie"])
  assert tally == ("Tally: the paper's claims: 1 checks, 0 hold, 0 fail, 1 tie, 0 untested.")


def test_reproduce_runs_the_seeds_and_checks_the_claim_on_them(tmp_path):
  """A tiny table (tests/tables/test_reproduce.py's, one round): DCCO against CCO + FedAvg in one
  column at seeds 0 and 1. The seed-1 cells run with seed 1, in folders of their own; the page lists
  both seeds; the claim reads each seed's results (checked here past the gate, which these one-round
  encoders do not clear)."""
  from tests.tables.test_reproduce import tiny_table  # pylint: disable=g-import-not-at-top
  table = tiny_table()
  rows = tuple(dataclasses.replace(r, learning_rates=r.learning_rates[:1], select_with="",
                                   config=dataclasses.replace(r.config, rounds=1))
               for r in table.rows[:2])
  table = dataclasses.replace(
      table, rows=rows, columns=table.columns[1:], curve_every=100, evaluations=table.evaluations[:1],
      claims=(tables.Claim("dcco", "fedavg_cco", "the test"),), seeds=(0, 1), tie=0.0,
      tie_why="none: the test's")
  out = tmp_path / "tiny"
  result = reproduce.reproduce(table, str(out), progress=False)
  todo, _ = reproduce.cells(table)
  results = {c.path: json.loads((out / c.path / "results.json").read_text()) for c in todo}
  for row in ("dcco", "fedavg_cco"):
    hparams = json.loads((out / "cells" / row / "iid_4_seed1" / "hparams.json").read_text())
    assert hparams["seed"] == 1
  seeds = table_report.seed_accuracies(table, todo, results)
  assert seeds[("linear_10", "dcco", "iid_4")] == {
      s: results[p]["linear_probe_accuracy_pretrained"]
      for s, p in ((0, "cells/dcco/iid_4"), (1, "cells/dcco/iid_4_seed1"))}
  md = open(result["table_md"]).read()
  assert "## Training seeds" in md and "| DCCO, IID 500 / 4 / 4 |" in md
  passing = table_report.Gate(("linear_10",), {(r, "iid_4"): {"linear_10": (0.05, 0.5)}
                                                for r in ("dcco", "fedavg_cco")})
  [line] = table_report.claim_lines(table, result["records"], passing, seeds)
  assert "(n = 2) points — " in line, line


def test_a_claim_missing_a_seed_is_untested_naming_it():
  """A lost seed (failed, or not run yet) would leave the verdict to the others: no verdict."""
  table = seeded_table()
  accs = {(k, r, "iid_8"): {0: 0.75, 1: 0.76, 2: 0.74} for k in KEYS for r in ("dcco", "fedavg_cco")}
  accs[("s0", "dcco", "iid_8")] = {0: 0.75, 1: tables.FAILED, 2: 0.74}
  del accs[("s1", "fedavg_cco", "iid_8")][2]
  records = [{"evaluation": k, "row": r, "column": "iid_8", "ours": 0.75, "status": "ok"}
             for k in KEYS for r in ("dcco", "fedavg_cco")]
  g = table_report.gate(table, records, {k: {"raw_pixels": 0.6, "random_init": 0.3} for k in KEYS})
  [line] = table_report.claim_lines(table, records, g, accs)
  assert line.endswith("— untested: DCCO, IID 7,500 / 8 / 16 failed at training seed 1"), line
  accs[("s0", "dcco", "iid_8")][1] = 0.76
  [line] = table_report.claim_lines(table, records, g, accs)
  assert line.endswith("CCO + FedAvg, IID 7,500 / 8 / 16 at training seed 2 not run yet"), line
