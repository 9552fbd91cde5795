"""What every registered table (`tasks.TABLES`) promises, at every scale it has: each cell, pilot and
capped (smoke) cell is a valid run config, the published numbers name its rows, columns and
evaluations, its claims and gate read evaluations it has, and its scales share one grid (a mini
table is the paper table at another size, not another table). A new table is checked by being
registered; its own test file checks its paper's numbers and claims."""

import dataclasses

import pytest

import tasks
from tff_ssl.experiment import ExperimentConfig

CASES = [(name, scale) for name in sorted(tasks.TABLES) for scale in sorted(tasks.TABLES[name])]


def cells(table):
  for row in table.rows:
    if not row.federated and not row.columns and row.supervised:
      continue  # The supervised row runs per label fraction (`supervised_config`).
    columns = [table.column(c) for c in row.columns] if row.columns else (
        table.columns if row.federated else [None])
    for column in columns:
      if column is None or row.skip_reason(column) is None:
        yield row, column


@pytest.mark.parametrize("name,scale", CASES)
def test_every_cell_and_its_capped_smoke_is_a_valid_run(name, scale):
  table = tasks.get_table(name, scale)
  assert table.name == name and table.scale == scale
  count = 0
  for capped in (table, table.capped(2)):
    for row, column in cells(capped):
      for rate in row.learning_rates or (None,):
        config = capped.cell_config(row, column, rate)
        assert isinstance(config, ExperimentConfig)
        # Building it again from its fields validates it as bin/train would.
        dataclasses.replace(config)
        count += 1
      if capped is not table:
        config = capped.cell_config(row, column)
        assert config.rounds <= 2 and config.steps <= 2, (row.key, column and column.key)
  assert count > 0


@pytest.mark.parametrize("name,scale", CASES)
def test_published_numbers_claims_and_gate_name_what_the_table_has(name, scale):
  table = tasks.get_table(name, scale)
  rows = {r.key for r in table.rows}
  columns = {c.key for c in table.columns}
  # A published number may be of an evaluation only the paper scale runs (DCCO's fine-tuning).
  evaluations = {e.key for s in tasks.TABLES[name] for e in tasks.get_table(name, s).evaluations}
  for evaluation, row, column in table.paper:
    assert evaluation in evaluations and row in rows and column in columns | {"", None}, (
        evaluation, row, column)
  own = {e.key for e in table.evaluations}
  for claim in table.claims:
    assert {claim.better, claim.base} <= rows
    assert set(claim.evaluations or table.gate_keys) <= own
  assert set(table.gate_keys) <= own


@pytest.mark.parametrize("name", sorted(n for n in tasks.TABLES if len(tasks.TABLES[n]) > 1))
def test_the_mini_table_has_every_row_and_claim_of_the_paper_table(name):
  """The mini scale is the paper's table at another size (other data, other columns, controls of its
  own), so every paper row runs in it and every claim between them that it can evaluate is checked."""
  mini, paper = tasks.get_table(name, "mini"), tasks.get_table(name, "paper")
  assert {r.key for r in paper.rows} <= {r.key for r in mini.rows}
  runs = {e.key for e in mini.evaluations}  # A claim on an evaluation mini runs (not fine-tuning).
  assert {(c.better, c.base, c.relation, c.label) for c in paper.claims
          if set(c.evaluations) <= runs} <= {
              (c.better, c.base, c.relation, c.label) for c in mini.claims}
