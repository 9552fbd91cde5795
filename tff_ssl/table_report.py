"""Renders a reproduced table: table.md (ours beside the paper's, every check with its numbers),
page.md (the same with the gate's and the claims' verdicts as grids: what a docs page shows),
table.csv, curves.png."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from typing import Any

from tff_ssl import rundir, table_plot, verdicts
from tff_ssl.tables import FAILED, Table

CSV_FIELDS = ("evaluation", "row", "column", "group", "total_clients", "samples_per_client",
              "clients_per_round", "ours", "paper", "status", "learning_rate")


def cell_accuracy(table: Table, result: dict[str, Any], evaluation_key: str) -> float | str:
  """The cell's number for one evaluation: a fraction in [0, 1], or FAILED."""
  if "failed" in result:
    return FAILED
  if evaluation_key == table.evaluations[0].key and table.in_run_main:
    return float(result["linear_probe_accuracy_pretrained"])
  return float(result["evaluations"][evaluation_key])


def fmt(value) -> str:
  """A fraction as a percentage with one decimal (a string passes through; None is empty)."""
  if value is None:
    return ""
  if isinstance(value, str):
    return value
  return f"{100 * value:.1f}"


def _paper(value) -> str:
  return "" if value is None else (value if isinstance(value, str) else f"{value:.1f}")


def collect(table: Table, todo, skipped, results) -> list[dict[str, Any]]:
  """One record per (evaluation, row, column) of the grid, with ours, the paper's and a status."""
  by_key = {(c.row.key, c.column.key if c.column else None, c.label_fraction, c.label_seed): c
            for c in todo if c.seed is None}  # Each row's own training seed (`seed_accuracies`).
  records = []
  for e in table.evaluations:
    for row in table.rows:
      targets = table.columns if row.federated else (None,)
      for column in targets:
        ckey = column.key if column else ""
        rec = {"evaluation": e.key, "row": row.key, "column": ckey,
               "group": column.group if column else "",
               "total_clients": column.num_clients or "" if column else "",
               "samples_per_client": column.samples_per_client or "" if column else "",
               "clients_per_round": column.clients_per_round or "" if column else "",
               "paper": table.paper.get((e.key, row.key, ckey)), "ours": None, "status": "",
               "learning_rate": ""}
        if row.federated and (row.key, ckey) in skipped:
          rec["status"] = "not run: " + skipped[(row.key, ckey)]
          records.append(rec)
          continue
        cell = by_key.get((row.key, ckey or None) + ((e.label_fraction, e.label_seed)
                                                     if row.supervised else (None, 0)))
        result = results.get(cell.path) if cell else None
        if result is None:
          rec["status"] = "not run yet"
        elif row.supervised:
          rec["ours"], rec["status"] = float(result["supervised_accuracy"]), "ok"
        else:
          value = cell_accuracy(table, result, e.key)
          rec["ours"] = None if value == FAILED else value
          rec["status"] = "ok" if value != FAILED else f"{FAILED}: {result['failed']}"
        records.append(rec)
  return records


# The rows every frozen-feature evaluation shows under the methods: (baselines key, row name).
BASELINE_ROWS = (("raw_pixels", "Raw pixels"),
                 ("random_init", "Encoder at random initialization"))


def beats_raw_pixels(table: Table, records, evaluation_key: str, raw_pixels: float,
                     cell_baselines=None) -> str:
  """One line: how many of an evaluation's pretrained cells beat the raw-pixel baseline (each its
  own, where `cell_baselines` gives one: another dataset's column)."""
  supervised = {r.key for r in table.rows if r.supervised}
  cells = [r for r in records if r["evaluation"] == evaluation_key and r["ours"] is not None
           and r["row"] not in supervised]
  raw = [(cell_baselines or {}).get((r["row"], r["column"]), {}).get(evaluation_key, {}).get(
      "raw_pixels", raw_pixels) for r in cells]
  above = sum(r["ours"] > b for r, b in zip(cells, raw))
  best = max(cells, key=lambda r: r["ours"] - raw[cells.index(r)], default=None)
  return (f"Pretrained cells above the raw-pixel row: {above} of {len(cells)}"
          + (f" (best {fmt(best['ours'])} vs {fmt(raw[cells.index(best)])})." if cells else "."))


# The gate (issue 31): a paper's ordering is tested only between cells whose encoders clear both
# baselines on the table's main probe, at every gate evaluation (each label-subset seed).
GATE_OVER_RAW_PIXELS = 0.01  # >= 1 point above the raw-pixel linear classifier,
GATE_OVER_RANDOM_INIT = 0.10  # and >= 10 points above the encoder at its initialization.
GOAL_OVER_RAW_PIXELS = 0.03  # What the regime aims at.
MIN_GATE_SEEDS = 2  # Label-subset seeds the gate needs.
UNTESTED = "untested: below the baselines"


@dataclasses.dataclass(frozen=True)
class Gate:
  """Which cells clear the baselines. `margins[(row, column)]`: {evaluation key: (points over raw
  pixels, points over random init)}, fractions, for each evaluation with baselines the cell has;
  `evaluations`: the gate's keys at the main label fraction; `problem`: why no cell can pass there
  (missing baselines, too few label seeds), or "". `at_fraction[f]`: the gate's keys at label
  fraction f (`Table.gate_keys_at`), `fractions[key]`: an evaluation's label fraction: a comparison
  at 1% of the labels is gated by the probe at 1% (issue 72), not at the main fraction."""

  evaluations: tuple[str, ...]
  margins: dict
  problem: str = ""
  own_baselines: frozenset = frozenset()  # (row, column) measured against baselines of its own.
  at_fraction: dict = dataclasses.field(default_factory=dict)
  fractions: dict = dataclasses.field(default_factory=dict)
  problems: dict = dataclasses.field(default_factory=dict)  # Gate keys -> problem ("" when none).

  def keys_for(self, evaluations=None) -> tuple[str, ...]:
    """The gate keys that gate a comparison at `evaluations` (default: the main gate's): the gate's
    probe at each of their label fractions."""
    if not evaluations or not self.fractions:
      return self.evaluations
    keys: list[str] = []
    for f in dict.fromkeys(self.fractions.get(k) for k in evaluations):
      keys += [k for k in self.at_fraction.get(f, ()) if k not in keys]
    return tuple(keys)

  def problem_for(self, keys) -> str:
    if tuple(keys) == tuple(self.evaluations):
      return self.problem
    if not keys:
      return "no gate probe at these label fractions"
    return self.problems.get(tuple(keys), "")

  def passes(self, row: str, column: str, evaluations=None) -> bool:
    keys = self.keys_for(evaluations)
    if self.problem_for(keys):
      return False
    m = self.margins.get((row, column), {})
    return all(k in m for k in keys) and all(
        m[k][0] >= GATE_OVER_RAW_PIXELS - 1e-9 and m[k][1] >= GATE_OVER_RANDOM_INIT - 1e-9
        for k in keys)

  def why_not(self, row: str, column: str, evaluations=None) -> str:
    """Why the cell does not pass (for a check's line)."""
    keys = self.keys_for(evaluations)
    problem = self.problem_for(keys)
    if problem:
      return problem
    m = self.margins.get((row, column), {})
    if not all(k in m for k in keys):
      return "not run on every gate evaluation"
    raws = ", ".join(f"{100 * m[k][0]:+.1f}" for k in keys)
    rnds = ", ".join(f"{100 * m[k][1]:+.1f}" for k in keys)
    where = "" if tuple(keys) == tuple(self.evaluations) else f" ({', '.join(keys)})"
    return f"over raw pixels {raws}, over random init {rnds} points{where}"

  def ordering(self, text: str, cells, holds: bool, evaluations=None) -> str:
    """A check's line: `text` and "holds" / "**fails**" when every cell of `cells` ((row, column)
    pairs) passes the gate at the comparison's label fractions; else the ordering is untested, with
    the first failing cell's margins."""
    failing = [(r, c) for r, c in cells if not self.passes(r, c, evaluations)]
    if not failing:
      return f"{text} — {'holds' if holds else '**fails**'}"
    row, column = failing[0]
    return f"{text} — {UNTESTED} ({row}: {self.why_not(row, column, evaluations)})"

  def compare(self, table: Table, records, better: str, base: str, column: str, strict: bool,
              label: str = "", within: float | None = None,
              evaluations: tuple[str, ...] | None = None, by: float | None = None) -> str:
    """An ordering between two rows in one column at every evaluation of `evaluations` (default:
    the gate's, the main probe's label seeds): "`label`: A a0 / a1 is above (strict) or at least B
    b0 / b1 (d0 / d1 points) — ..."; with `within` (points), "is within `within` points of" instead
    (|a - b| <= within). A row without columns (centralized, supervised) is read in column "".
    It holds when it holds at every evaluation; where it holds at some and not at others it fails,
    naming them. The gate reads the pretrained cells (not the supervised row's). A cell that failed,
    is not run or has no number yet makes the line "untested" with the reason: no check vanishes."""
    keys = tuple(evaluations or self.evaluations)
    if within is not None:
      words = f"is within {within:g} points of"
    elif by is not None:
      words = f"is at least {by:g} points above"
    else:
      words = "is above" if strict else "is at least"
    prefix = f"{label + ': ' if label else ''}"
    cells = [(k, column if table.row(k).federated else "") for k in (better, base)]
    missing = _missing(table, records, cells, keys)
    if missing:
      return (f"{prefix}{table.row(better).name} {words} {table.row(base).name} — untested: "
              f"{missing}")
    ours = {(r["evaluation"], r["row"], r["column"]): r["ours"] for r in records}
    a = [ours[(k, *cells[0])] for k in keys]
    b = [ours[(k, *cells[1])] for k in keys]
    if within is not None:
      held = [abs(100 * (x - y)) <= within for x, y in zip(a, b)]
    elif by is not None:
      held = [100 * (x - y) >= by - 1e-9 for x, y in zip(a, b)]
    else:
      held = [x > y if strict else x >= y for x, y in zip(a, b)]
    text = (f"{prefix}{table.row(better).name} "
            f"{' / '.join(fmt(x) for x in a)} {words} "
            f"{table.row(base).name} {' / '.join(fmt(y) for y in b)} "
            f"({' / '.join(f'{100 * (x - y):+.1f}' for x, y in zip(a, b))} points)")
    gated = [(r, c) for r, c in cells if not table.row(r).supervised]
    line = self.ordering(text, gated, all(held), keys)
    if any(held) and not all(held) and line.endswith("**fails**"):
      line += (f" at {', '.join(k for k, h in zip(keys, held) if not h)} (holds at "
               f"{', '.join(k for k, h in zip(keys, held) if h)})")
    return line


def _cell_name(table: Table, row: str, column: str) -> str:
  """"Row name, column heading" of a cell ("Row name" for a row without columns)."""
  if not column:
    return table.row(row).name
  c = table.column(column)
  return f"{table.row(row).name}, {f'{c.group} {c.label}'.strip()}"


def _missing(table: Table, records, cells, keys) -> str:
  """Why (row, column) `cells` have no number to compare at evaluations `keys`: "<cell> failed
  (<reason>)", "<cell> not run (<reason>)", "<cell> not run yet"; "" when every number is there."""
  by = {(r["evaluation"], r["row"], r["column"]): r for r in records}
  for row, column in cells:
    for k in keys:
      rec = by.get((k, row, column))
      status = rec.get("status", "") if rec else "not run yet"
      if rec is not None and rec["ours"] is not None:
        continue
      name = _cell_name(table, row, column)
      if status.startswith(FAILED):
        reason = status[len(FAILED):].lstrip(": ").split(";")[0]
        return f"{name} failed ({reason})"
      if status.startswith("not run:"):
        return f"{name} not run ({status[len('not run:'):].strip()})"
      return f"{name} not run yet"
  return ""


def claim_columns(table: Table, claim) -> list[str]:
  """`Table.claim_columns`."""
  return table.claim_columns(claim)


def verdict_of(line: str) -> str:
  """The verdict word of a check's line: one of `verdicts.VERDICTS` (holds, fails, tie,
  inconclusive, untested)."""
  tail = line.rsplit(" — ", 1)[-1]
  for word in ("untested", "tie", "inconclusive"):
    if tail.startswith(word):
      return word
  return "fails" if tail.startswith("**fails**") else "holds"


def claim_tally(table: Table, records, g: Gate, lines: list[str] | None = None,
                seeds=None) -> str:
  """One line: the checks of the paper's claims and of the project's own, each counted apart
  (`lines`: `claim_lines`' output, where the caller has it; `seeds`: `seed_accuracies`)."""
  counts = {False: dict.fromkeys(verdicts.VERDICTS, 0), True: dict.fromkeys(verdicts.VERDICTS, 0)}
  lines = claim_lines(table, records, g, seeds) if lines is None else lines
  for claim, line in zip(_claims_in_order(table), lines):
    counts[claim.own][verdict_of(line)] += 1
  words = {"holds": "hold", "fails": "fail", "tie": "tie", "inconclusive": "inconclusive",
           "untested": "untested"}
  parts = []
  for own, what in ((False, "the paper's claims"), (True, "the project's own")):
    c = counts[own]
    if sum(c.values()) or not own:
      shown = [v for v in verdicts.VERDICTS if c[v] or v in ("holds", "fails", "untested")]
      parts.append(f"{what}: {sum(c.values())} checks, " +
                   ", ".join(f"{c[v]} {words[v]}" for v in shown))
  return "Tally: " + "; ".join(parts) + "."


def _claims_in_order(table: Table):
  for claim in table.claims:
    for _ in claim_columns(table, claim):
      yield claim


def claim_lines(table: Table, records, g: Gate, seeds=None) -> list[str]:
  """Every claim of `table.claims` in every column it applies to, "[n] column: ... — holds /
  **fails** / untested: <why>", n numbering the claims as `claim_sources` lists them. A table with
  training seeds (`Table.seeds`) reads `seeds` (`seed_accuracies`) by the verdict rule
  (`seeded_compare`)."""
  return [line for _, _, line in _claim_checks(table, records, g, seeds)]


def _claim_checks(table: Table, records, g: Gate, seeds=None):
  """(claim number, column, check's line) of `claim_lines`, in its order."""
  for i, claim in enumerate(table.claims, 1):
    for column in claim_columns(table, claim):
      where = f"{table.column(column).group} {table.column(column).label}".strip() if column else ""
      label = ", ".join(x for x in (where, claim.label) if x)
      if table.seeds:
        line = seeded_compare(table, records, g, seeds or {}, claim, column, label)
      else:
        line = g.compare(table, records, claim.better, claim.base, column,
                         strict=claim.relation == "above", label=label,
                         within=claim.within if claim.relation == "within" else None,
                         evaluations=claim.evaluations or None,
                         by=claim.by if claim.relation == "by" else None)
      yield i, column, f"[{i}] {line}"


def seed_accuracies(table: Table, todo, results) -> dict:
  """{(evaluation, row, column): {training seed: accuracy, or FAILED}} of every pretrained cell at
  every seed it ran at (`Table.seeds_of`; an unfinished run has no entry), column "" for a row
  without columns."""
  out: dict = {}
  for cell in todo:
    result = results.get(cell.path)
    if cell.row.supervised or result is None:
      continue
    column = cell.column.key if cell.column is not None else ""
    for e in table.evaluations:
      if ("failed" in result or table.in_run_main and e.key == table.evaluations[0].key
          or e.key in result.get("evaluations", {})):
        out.setdefault((e.key, cell.row.key, column), {})[cell.training_seed] = cell_accuracy(
            table, result, e.key)
  return out


def seeded_compare(table: Table, records, g: Gate, seeds, claim, column: str, label: str) -> str:
  """A claim by `tff_ssl.verdicts`' rule: the paired differences per training seed (the mean over
  the evaluations it reads, the gate's label seeds), their 90% interval and the verdict against the
  table's tie margin. Untested where a row does not clear the gate (its own seed's cell) or fewer
  than `verdicts.MIN_SEEDS` seeds have both rows."""
  keys = tuple(claim.evaluations or g.evaluations)
  words = {"above": "is above", "at_least": "is at least",
           "within": f"is within {claim.within:g} points of",
           "by": f"is at least {claim.by:g} points above"}[claim.relation]
  prefix = f"{label + ': ' if label else ''}"
  text = f"{prefix}{table.row(claim.better).name} {words} {table.row(claim.base).name}"
  cells = [(k, column if table.row(k).federated else "") for k in (claim.better, claim.base)]
  missing = _missing(table, records, cells, keys)
  if missing:
    return f"{text} — untested: {missing}"
  gated = [(r, c) for r, c in cells if not table.row(r).supervised]
  failing = [(r, c) for r, c in gated if not g.passes(r, c, keys)]
  if failing:
    row, col = failing[0]
    return f"{text} — {UNTESTED} ({row}: {g.why_not(row, col, keys)})"
  for r, c in cells:  # Every seed of both rows, or no verdict: a lost seed would bias the rest.
    for s in table.seeds_of(table.row(r), c):
      got = [seeds.get((k, r, c), {}).get(s) for k in keys]
      if FAILED in got:
        return f"{text} — untested: {_cell_name(table, r, c)} failed at training seed {s}"
      if None in got:
        return f"{text} — untested: {_cell_name(table, r, c)} at training seed {s} not run yet"
  both = [{(s, k): acc for k in keys for s, acc in seeds.get((k, r, c), {}).items()}
          for r, c in cells]
  verdict, iv, why = verdicts.check(both[0], both[1], claim.relation, table.tie,
                                    claim.by if claim.relation == "by" else claim.within)
  if iv is None:
    return f"{text} — untested: {why}"
  word = "**fails**" if verdict == "fails" else verdict
  return f"{text}: {iv.text()} points — {word}"


def claim_sources(table: Table) -> list[str]:
  """Where the paper makes its claims, lettered (a), (b), ..., then the claims, numbered as
  `claim_lines` numbers them, each with its rows, relation, evaluations and source's letter."""
  letters = _source_letters(table)
  return [f"({letter}) {source}" for source, letter in letters.items()] + [
      _claim_name(table, i, c, letters, with_evaluations=True)
      for i, c in enumerate(table.claims, 1)]


def _source_letters(table: Table) -> dict[str, str]:
  letters: dict[str, str] = {}
  for c in table.claims:
    letters.setdefault(c.source, chr(ord("a") + len(letters)))
  return letters


def _claim_name(table: Table, i: int, c, letters, with_evaluations: bool) -> str:
  """"[i] A above B, label (evaluations) (source's letter)"."""
  words = {"above": "above", "at_least": "at least"}
  relation = (f"within {c.within:g} points of" if c.relation == "within" else
              f"at least {c.by:g} points above" if c.relation == "by" else words[c.relation])
  evals = f" ({', '.join(c.evaluations) or ', '.join(table.gate_keys)})" if with_evaluations else ""
  label = f", {c.label}" if c.label else ""
  return (f"[{i}] {table.row(c.better).name} {relation} {table.row(c.base).name}{label}{evals} "
          f"({letters[c.source]})")


def _gate_problem(keys, baselines) -> str:
  missing = [k for k in keys if k not in (baselines or {})]
  if missing:
    return f"no baselines for {missing[0]}"
  if len(keys) < MIN_GATE_SEEDS:
    return f"the main probe at {len(keys)} label seed; the gate needs {MIN_GATE_SEEDS}"
  return ""


def gate(table: Table, records, baselines, cell_baselines=None) -> Gate:
  """The gate of a table's pretrained cells on its main probe (`table.gate_evaluations`, default the
  first evaluation), against the raw-pixel and random-init rows of the same evaluation, at each
  label fraction the table evaluates (`Table.gate_keys_at`); `cell_baselines[(row, column)]
  [evaluation]` replaces them for a cell (`Table.cell_baselines`)."""
  keys = table.gate_keys
  fractions = {e.key: e.label_fraction for e in table.evaluations}
  at_fraction = {f: table.gate_keys_at(f) for f in dict.fromkeys(fractions.values())}
  gate_keys = {k for ks in at_fraction.values() for k in ks} | set(keys)
  margins: dict = {}
  supervised = {r.key for r in table.rows if r.supervised}  # No pretrained encoder to gate.
  for rec in records:
    if rec["evaluation"] in gate_keys and rec["ours"] is not None and rec["evaluation"] in (
        baselines or {}) and rec["row"] not in supervised:
      base = {**baselines[rec["evaluation"]],
              **(cell_baselines or {}).get((rec["row"], rec["column"]), {}).get(
                  rec["evaluation"], {})}
      margins.setdefault((rec["row"], rec["column"]), {})[rec["evaluation"]] = (
          rec["ours"] - base["raw_pixels"], rec["ours"] - base["random_init"])
  # The cells gated against baselines other than the table's (another dataset, encoder or seed).
  own = frozenset(cell for cell, evals in (cell_baselines or {}).items()
                  if any(evals.get(k) is not None and baselines and k in baselines and
                         any(evals[k].get(b) != baselines[k][b] for b in evals[k]) for k in keys))
  problems = {tuple(ks): _gate_problem(ks, baselines) for ks in at_fraction.values() if ks}
  return Gate(keys, margins, _gate_problem(keys, baselines), own, at_fraction, fractions, problems)


def gate_lines(table: Table, g: Gate) -> list[str]:
  """The gate section: each pretrained cell's margins and whether it passes, at the main label
  fraction, then at each other fraction the table evaluates with the gate's probe."""
  lines = [f"A cell passes when it is >= {100 * GATE_OVER_RAW_PIXELS:.0f} point above raw pixels "
           f"and >= {100 * GATE_OVER_RANDOM_INIT:.0f} above random init on every gate evaluation "
           f"({', '.join(g.evaluations)}); the goal is raw pixels + "
           f"{100 * GOAL_OVER_RAW_PIXELS:.0f}. An ordering is tested only between cells that pass"
           + (" at the label fraction it compares." if any(
               keys and tuple(keys) != tuple(g.evaluations) for keys in g.at_fraction.values())
              else ".")]
  lines += _gate_table(table, g, g.evaluations)
  for fraction, keys in g.at_fraction.items():
    if keys and tuple(keys) != tuple(g.evaluations):
      lines += ["", f"At {100 * fraction:g}% of the labels ({', '.join(keys)}):"]
      lines += _gate_table(table, g, keys)
  return lines


def _gate_table(table: Table, g: Gate, keys) -> list[str]:
  names = {r.key: r.name for r in table.rows}
  labels = {c.key: f"{c.group} {c.label}".strip() for c in table.columns}
  problem = g.problem_for(keys)
  lines = [f"No cell can pass: {problem}; every ordering is {UNTESTED}."] if problem else []
  cells = [(cell, m) for cell, m in g.margins.items() if all(k in m for k in keys) or problem]
  if not cells:
    return lines
  lines += ["", "| cell | over raw pixels (points) | over random init (points) | gate |",
            "|---|---|---|---|"]
  for (row, column), m in cells:
    raws = [m[k][0] for k in keys if k in m]
    verdict = ("passes" + (", goal met" if min(raws) >= GOAL_OVER_RAW_PIXELS - 1e-9 else "")
               if g.passes(row, column, keys) else "untested" if problem else "**fails**")
    where = f"{names.get(row, row)}" + (f", {labels.get(column, column)}" if column else "") + (
        " (against its own baselines)" if (row, column) in g.own_baselines else "")
    lines.append(f"| {where} | {', '.join(f'{100 * v:+.1f}' for v in raws)} | "
                 f"{', '.join(f'{100 * m[k][1]:+.1f}' for k in keys if k in m)} | {verdict} |")
  return lines


def _gate_word(g: Gate, row: str, column: str, keys) -> str:
  m = g.margins.get((row, column))
  if g.problem_for(keys):
    return "untested"
  if not m or not all(k in m for k in keys):
    return "…" if m else ""
  if not g.passes(row, column, keys):
    return "**fails**"
  return "goal met" if min(m[k][0] for k in keys) >= GOAL_OVER_RAW_PIXELS - 1e-9 else "passes"


def gate_grid(table: Table, g: Gate) -> list[str]:
  """The page's gate: the results grid's layout, each pretrained cell's verdict ("goal met",
  "passes", "**fails**") at the main label fraction, then " / " at each other fraction the gate
  reads; the margins are table.md's (`gate_lines`)."""
  fractions = [g.evaluations] + [tuple(k) for k in g.at_fraction.values()
                                 if k and tuple(k) != tuple(g.evaluations)]
  at = " / ".join(f"{100 * g.fractions.get(ks[0], 0):g}%" if g.fractions else ", ".join(ks)
                  for ks in fractions)
  lines = [f"A cell passes when it is >= {100 * GATE_OVER_RAW_PIXELS:.0f} point above raw pixels "
           f"and >= {100 * GATE_OVER_RANDOM_INIT:.0f} above random init at every label seed of the "
           f"gate's probe ({'; '.join(', '.join(ks) for ks in fractions)}); the goal is raw pixels "
           f"+ {100 * GOAL_OVER_RAW_PIXELS:.0f}. An ordering is tested only between cells that "
           f"pass{' at the label fraction it compares' if len(fractions) > 1 else ''}. Each cell's "
           "margins: table.md in the run folder."]
  problem = "; ".join(dict.fromkeys(p for p in (g.problem_for(ks) for ks in fractions) if p))
  if problem:
    lines.append(f"No cell can pass at some label fraction: {problem}.")
  own = {row for row, _ in g.own_baselines}
  lines += ["", f"| gate at {at} labels | " + " | ".join(
      f"{c.group} {c.label}".strip() for c in table.columns) + " |",
            "|---" * (len(table.columns) + 1) + "|"]
  for row in table.rows:
    if row.supervised:
      continue
    columns = [c.key for c in table.columns] if row.federated else [""]
    cells = [" / ".join(_gate_word(g, row.key, c, ks) for ks in fractions) for c in columns]
    cells = [c if c.strip(" /") else "—" for c in cells]
    cells += [""] * (len(table.columns) - len(cells))
    lines.append(f"| {row.name}{' (its own baselines)' if row.key in own else ''} | "
                 + " | ".join(cells) + " |")
  return lines


def claims_grid(table: Table, checks) -> list[str]:
  """The page's claims: a row per claim, a column per table column (and "pooled" for a claim
  between rows without columns), each cell the verdict of that claim's check there (`checks`:
  `_claim_checks`' (claim number, column, line)); the numbers are table.md's."""
  verdict: dict = {}
  for i, column, line in checks:
    word = verdict_of(line)
    verdict[(i, column)] = "**fails**" if word == "fails" else word
  columns = [c for c in table.columns if any(k == c.key for _, k in verdict)]
  pooled = any(k == "" for _, k in verdict)
  letters = _source_letters(table)
  lines = ["| claim | " + " | ".join(f"{c.group} {c.label}".strip() for c in columns)
           + (" | pooled" if pooled else "") + " |",
           "|---" * (len(columns) + 1 + pooled) + "|"]
  for i, c in enumerate(table.claims, 1):
    cells = [verdict.get((i, col.key), "") for col in columns]
    if pooled:
      cells.append(verdict.get((i, ""), ""))
    lines.append(f"| {_claim_name(table, i, c, letters, with_evaluations=False)} | "
                 + " | ".join(cells) + " |")
  return lines


def margins_over_raw_pixels(table: Table, records, evaluation_key: str, raw_pixels: float) -> str:
  """One line: each pooled-data pretraining row (centralized: the bound the federated rows work
  under) against the raw-pixel row, in points; empty when the table has none."""
  by = {r["row"]: r["ours"] for r in records
        if r["evaluation"] == evaluation_key and r["column"] == "" and r["ours"] is not None}
  parts = [f"{row.name} {fmt(by[row.key])} ({100 * (by[row.key] - raw_pixels):+.1f})"
           for row in table.rows if not row.federated and not row.supervised and row.key in by]
  return ("Centralized rows minus raw pixels, points: " + ", ".join(parts) + ".") if parts else ""


def _results_table(table: Table, records, e) -> list[str]:
  """An evaluation's grid: a row per table row, a cell per column (a row without columns fills the
  first)."""
  by = {(r["evaluation"], r["row"], r["column"]): r for r in records}
  headings = [f"{c.group} {c.label}" for c in table.columns]
  lines = [f"| {table.column_heading} | " + " | ".join(headings) + " |\n",
           "|---" * (len(headings) + 1) + "|\n"]
  for row in table.rows:
    if row.federated:
      cells = [_cell_text(by[(e.key, row.key, c.key)]) for c in table.columns]
    else:
      cells = [_cell_text(by[(e.key, row.key, "")])] + [""] * (len(table.columns) - 1)
    lines.append(f"| {row.name} | " + " | ".join(cells) + " |\n")
  return lines


def _baseline_lines(table: Table, records, e, baselines, cell_baselines) -> list[str]:
  """Under an evaluation's grid, what a pretrained encoder must beat under its protocol (same
  labels, same probe budget): the table's baselines, or each column's where a column changes them
  (its dataset, say), then the lines that read them; a blank line where there are none."""
  if not (baselines and e.key in baselines):
    return ["\n"]
  lines = []
  per_column = column_baselines(table, cell_baselines or {}, e.key)
  for key, name in BASELINE_ROWS:
    if per_column and len({v[key] for v in per_column.values()}) > 1:
      lines.append(f"| *{name}* | " + " | ".join(fmt(per_column.get(c.key, {}).get(key))
                                                 for c in table.columns) + " |\n")
    else:
      lines.append(f"| *{name}* | {fmt(baselines[e.key][key])} |" +
                   " |" * (len(table.columns) - 1) + "\n")
  lines.append("\n")
  raw_pixels = baselines[e.key]["raw_pixels"]
  lines.append(f"{beats_raw_pixels(table, records, e.key, raw_pixels, cell_baselines)}\n\n")
  margins = margins_over_raw_pixels(table, records, e.key, raw_pixels)
  if margins:
    lines.append(f"{margins}\n\n")
  return lines


def _evaluation_section(table: Table, records, e, baselines, cell_baselines) -> str:
  """An evaluation's section: its grid of ours (paper), then its baselines."""
  return "".join([f"## {e.name}\n\n", *_results_table(table, records, e),
                  *_baseline_lines(table, records, e, baselines, cell_baselines)])


def _learning_rates_section(table: Table, choices) -> str:
  """The rows' learning rates: the pilots' choices (a table of their validation scores), then each
  other row's, fixed or waiting for its pilots."""
  lines = ["## Learning rates\n\n"]
  if choices:
    lines += ["Chosen per row on a validation split held out of the training data (never the test "
              "split); pilot runs of the length given (rounds or steps):\n\n",
              "| row | chosen | validation linear probe per candidate | pilot length | column |\n",
              "|---|---|---|---|---|\n"]
    for row in table.rows:
      if row.key in choices:
        ch = choices[row.key]
        scores = ", ".join(f"{lr}: {fmt(s) if s >= 0 else FAILED}"
                           for lr, s in ch["validation_linear_probe"].items())
        if ch.get("selected_with"):
          scores = f"{table.row(ch['selected_with']).name}'s choice ({scores})"
        tried = [float(lr) for lr in ch["validation_linear_probe"]]
        edge = (" (at the grid's edge: a larger / smaller candidate not tried)"
                if len(tried) > 1 and not ch.get("selected_with")
                and ch["learning_rate"] in (min(tried), max(tried)) else "")
        lines.append(f"| {row.name} | {ch['field']} = {ch['learning_rate']:g}{edge} | {scores} | "
                     f"{ch['pilot_length']} | {ch['column'] or '—'} |\n")
    lines.append("\n")
  pending = {r.key for r in table.chosen_rows}
  for row in table.rows:
    if row.key in choices:
      continue
    if row.key in pending:  # Its pilots (or those of the row it takes its choice from) not run yet.
      lines.append(f"- {row.name}: {row.lr_field} from pilots not run yet (candidates "
                   f"{', '.join(f'{lr:g}' for lr in row.learning_rates)}).\n")
      continue
    lr = getattr(table.cell_config(row, table.columns[0] if row.federated else None), row.lr_field)
    lines.append(f"- {row.name}: fixed {row.lr_field} {lr:g}.\n")
  return "".join(lines)


def _notes_section(table: Table, records) -> str:
  """The table's notes, then each status of a cell that has no number (empty when neither)."""
  notes = sorted({r["status"] for r in records if r["status"] not in ("ok", "")})
  if not (notes or table.notes):
    return ""
  lines = ["\n## Notes\n\n"] + [f"- {n}\n" for n in table.notes]
  for n in notes:  # Each with the mark its cells carry in the tables above.
    mark = "— " if n.startswith("not run:") else "… " if n == "not run yet" else ""
    lines.append(f"- {mark}{n}\n")
  return "".join(lines)


def _claims_section(table: Table, records, g: Gate, seeds=None, page: bool = False) -> str:
  """The paper's claims, their sources, then each checked (empty for a table without claims); on
  the page (`page`), the sources and the verdict of each claim in each column."""
  if not table.claims:
    return ""
  if page:
    checks = list(_claim_checks(table, records, g, seeds))
    checked = [line for _, _, line in checks]
    letters = _source_letters(table)
    rule = ("by the verdict rule over training seeds" if table.seeds else
            "a claim holds where it holds at every evaluation it reads")
    return "".join(["\n## The paper's claims\n\n",
                    f"Each claim's verdict in each column it applies to ({rule}); each check's "
                    "numbers: table.md in the run folder.\n\n",
                    *[f"- ({letter}) {source}\n" for source, letter in letters.items()], "\n",
                    *[f"{line}\n" for line in claims_grid(table, checks)],
                    f"\n{claim_tally(table, records, g, checked)}\n"])
  if table.seeds:
    rule = (f"Every comparison the paper makes about these rows, checked in every column it "
            f"applies to at training seeds {', '.join(map(str, table.seeds))}: "
            f"{verdicts.METHOD}, in points. Tie margin {table.tie:g} "
            f"point{'' if table.tie == 1 else 's'}: "
            f"{table.tie_why}. Holds: the interval above +{table.tie:g}; fails: below "
            f"-{table.tie:g}; tie: inside; inconclusive: across a bound; untested: a row below "
            f"the gate (its own seed's cell) or under {verdicts.MIN_SEEDS} seeds.\n\n")
  else:
    rule = ("Every comparison the paper makes about these rows, checked in every column it "
            "applies to, at each evaluation it reads (the numbers: one per evaluation; a claim "
            "holds where it holds at all of them).\n\n")
  lines = ["\n## The paper's claims\n\n", rule]
  lines += [f"- {line}\n" for line in claim_sources(table)]
  lines.append("\nChecked:\n\n")
  checked = claim_lines(table, records, g, seeds)
  lines += [f"- {line}\n" for line in checked]
  lines.append(f"\n{claim_tally(table, records, g, checked)}\n")
  return "".join(lines)


def _checks_section(table: Table, records, g: Gate) -> str:
  """The table's own checks (a table without claims always has the section, empty or not)."""
  extra = table.checks(table, records, g) if table.checks else []
  if not (extra or not table.claims):
    return ""
  return "".join(["\n## Checks\n\n"] + [f"- {line}\n" for line in extra])


def _run_time(timing) -> str:
  """The closing line: the invocations' time and the training runs' share of it."""
  inv = timing.get("invocations", [])
  return (f"\nRun time: {sum(inv) / 60:.1f} min over {len(inv)} invocation(s) of bin/reproduce "
          f"({sum(timing.get('runs', {}).values()) / 60:.1f} min in training runs and their "
          f"evaluations).\n")


def _seeds_section(table: Table, seeds) -> str:
  """Each claim cell's main probe at each training seed (empty for a table without seeds)."""
  if not table.seeds:
    return ""
  main = table.evaluations[0].key
  lines = ["\n## Training seeds\n\n",
           f"The main probe ({table.evaluations[0].name}) of each cell a claim compares, at each "
           "training seed.\n\n", "| cell | " + " | ".join(f"seed {s}" for s in table.seeds) +
           " |\n", "|---" * (len(table.seeds) + 1) + "|\n"]
  for row, column in sorted(table.claim_cells(), key=lambda rc: (
      [r.key for r in table.rows].index(rc[0]), rc[1])):
    got = seeds.get((main, row, column), {})
    lines.append(f"| {_cell_name(table, row, column)} | " +
                 " | ".join(fmt(got.get(s)) if s in got else "…" for s in table.seeds) + " |\n")
  return "".join(lines)


def _markdown(table: Table, records, choices, random_acc, timing, baselines=None,
              appendix: str = "", cell_baselines=None, seeds=None, page: bool = False) -> str:
  """table.md: the title, a section per evaluation, the learning rates, the notes, the gate, the
  paper's claims, the table's checks, its appendix and the run time. page.md (`page`): the same,
  with the gate's and the claims' verdicts as grids, their numbers left to table.md."""
  parts = [f"# {table.title} — `{table.name}`, scale `{table.scale}`\n\n",
           "Each cell: **ours** (paper). Top-1 test accuracy in percent.\n\n"]
  parts += [_evaluation_section(table, records, e, baselines, cell_baselines)
            for e in table.evaluations]
  if not baselines:
    parts.append(f"Linear probe of the encoder at random initialization: {fmt(random_acc)}.\n\n")
  parts += [_learning_rates_section(table, choices), _notes_section(table, records)]
  g = gate(table, records, baselines, cell_baselines)
  parts += ["\n## Gate\n\n", "\n".join((gate_grid if page else gate_lines)(table, g)) + "\n",
            _claims_section(table, records, g, seeds, page), _seeds_section(table, seeds or {}),
            _checks_section(table, records, g)]
  if appendix:
    parts.append(f"\n{appendix.rstrip()}\n")
  parts.append(_run_time(timing))
  return "".join(parts)


def column_baselines(table: Table, cell_baselines: dict, evaluation_key: str) -> dict:
  """{column: {"raw_pixels", "random_init"}} under one evaluation: each column's first federated
  row's cell's baselines (the table's rows all share one encoder but for the rows that change it)."""
  out = {}
  for c in table.columns:
    for row in table.rows:
      b = cell_baselines.get((row.key, c.key), {}).get(evaluation_key)
      if row.federated and b and "raw_pixels" in b:
        out[c.key] = b
        break
  return out


def _cell_text(rec) -> str:
  paper = _paper(rec["paper"])
  paper = f" ({paper})" if paper else ""
  if rec["status"].startswith("not run:"):
    return f"—{paper}"
  if rec["status"].startswith(FAILED):
    return f"**failed**{paper}"
  if rec["ours"] is None:
    return f"…{paper}"
  return f"**{fmt(rec['ours'])}**{paper}"


def plot(table: Table, output_dir: str, todo, results, random_acc, raw_pixels=None) -> str:
  """curves.png: each cell's training loss per round and its linear-probe points, a failed cell's
  curve ending at a marker (`tff_ssl.table_plot`)."""
  return table_plot.plot(table, output_dir, todo, results, random_acc, raw_pixels)


def baseline_records(table: Table, baselines) -> list[dict[str, Any]]:
  """table.csv's rows of the baselines (row "raw_pixels" / "random_init", no column)."""
  return [{"evaluation": e.key, "row": key, "column": "", "group": "", "total_clients": "",
           "samples_per_client": "", "clients_per_round": "", "paper": None,
           "ours": baselines[e.key][key], "status": "baseline", "learning_rate": ""}
          for e in table.evaluations if baselines and e.key in baselines
          for key, _ in BASELINE_ROWS]


def write(table: Table, output_dir: str, todo, skipped, results, choices, random_acc, timing,
          baselines=None, appendix: str = "", cell_baselines=None) -> dict[str, Any]:
  records = collect(table, todo, skipped, results)
  for rec in records:
    row = table.row(rec["row"])
    if row.key in choices:
      rec["learning_rate"] = f"{choices[row.key]['learning_rate']:g}"
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
  writer.writeheader()
  for rec in records + baseline_records(table, baselines):
    writer.writerow({**rec, "ours": "" if rec["ours"] is None else f"{100 * rec['ours']:.2f}",
                     "paper": "" if rec["paper"] is None else rec["paper"]})
  rundir.write_atomic(os.path.join(output_dir, "table.csv"), buf.getvalue())
  seeds = seed_accuracies(table, todo, results)
  md = _markdown(table, records, choices, random_acc, timing, baselines, appendix, cell_baselines,
                 seeds)
  rundir.write_atomic(os.path.join(output_dir, "table.md"), md)
  page = _markdown(table, records, choices, random_acc, timing, baselines, appendix,
                   cell_baselines, seeds, page=True)
  rundir.write_atomic(os.path.join(output_dir, "page.md"), page)
  curve_key = table.curve_evaluation.key if table.curve_evaluation is not None else None
  raw = (baselines or {}).get(curve_key, {}).get("raw_pixels")
  png = plot(table, output_dir, [c for c in todo if c.seed is None], results, random_acc, raw)
  return {"records": records, "table_md": os.path.join(output_dir, "table.md"),
          "page_md": os.path.join(output_dir, "page.md"),
          "table_csv": os.path.join(output_dir, "table.csv"), "curves_png": png}
