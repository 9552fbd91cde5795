"""curves.png of a reproduced table: for each column a pair of panels, each cell's training loss per
round (centralized rows: per step, dashed) above its linear-probe points; a failed run's loss ends
at a red cross; one legend at the right, beside the panels."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import tempfile
import textwrap
from typing import Any

import numpy as np

from tff_ssl.tables import Table

PANELS_PER_ROW = 4  # Columns of panel pairs in a figure row.
PANEL_SIZE = (4.0, 5.0)  # Inches of one panel pair (width, loss and probe panels together).
LEGEND_WRAP = 34  # Characters per line of a legend entry.
TITLE_WRAP = 44  # Characters per line of a panel's title.
# A panel whose longest row runs this many times the shortest one's rounds gets a symmetric-log x
# axis (linear up to the shortest), so that the short one shows.
WIDE_LENGTHS = 20
MARKERS_UP_TO = 30  # A series of at most this many points also marks its points.
FAILED_STYLE = dict(marker="x", color="red", ms=9, mew=2.2, ls="none")
# Distinct colors for up to 16 rows: matplotlib's tab10, then six darker ones.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf", "#000000", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")


@dataclasses.dataclass(frozen=True)
class Series:
  """What the figure draws of one cell: its finite losses at the rounds (steps) they were logged at,
  its linear-probe points (fractions) and its length. A failed run's losses end at its last finite
  one, before the first that is not."""

  rounds: np.ndarray
  losses: np.ndarray
  probe_rounds: np.ndarray
  probe_accuracy: np.ndarray
  length: int
  failed: bool


def cell_length(cell) -> int:
  """Rounds of a federated cell (its column's override included), steps of a centralized one."""
  config = cell.column.apply(cell.row.config) if cell.column is not None else cell.row.config
  return config.rounds if cell.row.federated else config.steps


def _number(text: str | None) -> float:
  try:
    return float(text) if text not in (None, "") else math.nan
  except ValueError:
    return math.nan


def read_metrics(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(rounds, losses, probe rounds, probe accuracies) of a metrics.csv (`round` or `step` first; the
  probe's point is after its round, at round + 1). Losses may be nan or inf; a missing file is
  empty."""
  rounds, losses, probe_rounds, probe = [], [], [], []
  if os.path.exists(path):
    with open(path, newline="") as f:
      reader = csv.DictReader(f)
      key = (reader.fieldnames or ["round"])[0]
      for rec in reader:
        r = _number(rec.get(key))
        if math.isnan(r):
          continue
        rounds.append(int(r))
        losses.append(_number(rec.get("loss")))
        acc = _number(rec.get("linear_probe_accuracy"))
        if math.isfinite(acc):
          probe_rounds.append(int(r) + 1)
          probe.append(acc)
  return (np.asarray(rounds, int), np.asarray(losses, float), np.asarray(probe_rounds, int),
          np.asarray(probe, float))


def series(output_dir: str, cell, result: dict[str, Any] | None, random_acc: float | None
           ) -> Series | None:
  """The series of a cell (None: the supervised row's, or a cell with nothing to draw yet). Round 0
  of the probe is `random_acc` (where measured), its last point the run's final probe."""
  if cell.row.supervised:
    return None
  run_dir = os.path.join(output_dir, cell.path)
  rounds, losses, probe_rounds, probe = read_metrics(os.path.join(run_dir, "metrics.csv"))
  if result is None and not len(rounds):
    return None
  failed = bool(result) and "failed" in result
  finite = np.isfinite(losses)
  if failed and not finite.all():
    end = int(np.argmin(finite))  # The first loss that is not finite: the run failed there.
    finite[end:] = False
    probe_keep = probe_rounds <= (rounds[end - 1] + 1 if end else 0)
    probe_rounds, probe = probe_rounds[probe_keep], probe[probe_keep]
  length = cell_length(cell)
  xs, ys = list(probe_rounds), list(probe)
  if random_acc is not None:
    xs, ys = [0] + xs, [random_acc] + ys
  if result and "linear_probe_accuracy_pretrained" in result:
    # At the run's end: its length, or its last round where it ran longer (an older grid's folder).
    xs.append(max([length] + [int(r) + 1 for r in rounds[-1:]] + xs))
    ys.append(float(result["linear_probe_accuracy_pretrained"]))
  return Series(rounds[finite], losses[finite], np.asarray(xs, int), np.asarray(ys, float), length,
                failed)


def _forward(values: np.ndarray, linthresh: float | None) -> np.ndarray:
  """Values in the y axis' coordinates: log10, or a symmetric log for an axis that crosses 0."""
  if linthresh is None:
    return np.log10(values)
  return np.sign(values) * np.log10(1 + np.abs(values) / linthresh)


def _inverse(u: float, linthresh: float | None) -> float:
  if linthresh is None:
    return 10 ** u
  return math.copysign(linthresh * (10 ** abs(u) - 1), u)


def loss_axis(kept: list[np.ndarray], failed: list[np.ndarray]
              ) -> tuple[float | None, tuple[float, float]] | None:
  """(symlog linear threshold or None for a log axis, y limits) of a loss panel: the 1st-99th
  percentile band of the runs that did not fail (of all runs where all failed), widened by a factor
  of 2 on each side but no further than the data reach, so that one diverging run flattens no other.
  None where there is nothing to draw."""
  everything = np.concatenate(kept + failed) if kept or failed else np.zeros(0)
  if not everything.size:
    return None
  band = np.concatenate(kept) if kept and np.concatenate(kept).size else everything
  linthresh = None
  if (everything <= 0).any():
    small = np.abs(everything[everything != 0])
    linthresh = 10.0 ** math.floor(math.log10(np.percentile(small, 10))) if small.size else 1.0
  lo, hi = _forward(np.percentile(band, [1, 99]), linthresh)
  data_lo, data_hi = _forward(np.array([everything.min(), everything.max()]), linthresh)
  widen = math.log10(2)
  bottom, top = max(lo - widen, data_lo), min(hi + widen, data_hi)
  margin = max(0.04 * (top - bottom), 0.05)
  return linthresh, (_inverse(bottom - margin, linthresh), _inverse(top + margin, linthresh))


def _short_log_ticks(ax, bottom: float, top: float) -> None:
  """Plain labels at 1-9 (under a decade) or 1, 2, 5 (under three) times powers of 10 on a log axis
  that spans few decades, where its default labels only one tick or none."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  decades = math.log10(top / bottom)
  if decades >= 2.5:
    return
  subs = tuple(range(1, 10)) if decades < 1 else (1, 2, 5)
  ax.yaxis.set_major_locator(ticker.LogLocator(subs=subs))
  ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _panel_cells(todo, column) -> list:
  """The cells a column's panels show: its own, and every centralized row's."""
  return [c for c in todo if not c.row.supervised and
          (c.column is None or c.column.key == column.key)]


def _wrap(text: str, width: int) -> str:
  return "\n".join(textwrap.wrap(text, width)) or text


@dataclasses.dataclass(frozen=True)
class _Layout:
  """The figure's grid and size: `ncols` x `nrows` panel pairs, a legend column `legend_w` inches
  wide in type of `font` points, the whole `width` x `height` inches."""

  ncols: int
  nrows: int
  font: int
  legend_w: float
  width: float
  height: float


def _layout(columns: int, rows: int) -> _Layout:
  """The layout of a figure of `columns` panel pairs (at least one) and `rows` drawn rows: the
  figure is as tall as its panels or its legend (the rows and up to two more entries)."""
  n = max(1, columns)
  ncols = min(PANELS_PER_ROW, n)
  nrows = (n + ncols - 1) // ncols
  entries = rows + 2
  font = 8 if entries <= 11 else 7
  legend_w = LEGEND_WRAP * font * 0.55 / 72 + 0.8
  legend_h = (entries * 1.6 + 2) * font * 1.5 / 72
  width = PANEL_SIZE[0] * ncols + legend_w
  height = max(PANEL_SIZE[1] * nrows + 0.7, legend_h)
  return _Layout(ncols, nrows, font, legend_w, width, height)


def _failed_marker(ax_loss, s: Series, color: str, axis) -> None:
  """The red cross at a failed run's last finite loss, held inside the panel's y limits; a loss
  outside them is written beside the cross."""
  if s.losses.size and axis is not None:
    bottom, top = axis[1]
    last = float(s.losses[-1])
    y = min(max(last, bottom), top)
    ax_loss.plot([s.rounds[-1]], [y], clip_on=False, zorder=5, **FAILED_STYLE)
    if y != last:
      ax_loss.annotate(f"{last:.2g} (round {s.rounds[-1]})", (s.rounds[-1], y),
                       xytext=(6, -10), textcoords="offset points", fontsize=7, color=color)


def _draw_cell(ax_loss, ax_acc, cell, s: Series, color: str, axis) -> bool:
  """One cell's loss curve (solid: federated, dashed: centralized) and its probe points; whether
  it has probe points."""
  style = dict(color=color, ls="-" if cell.row.federated else "--",
               lw=0.9 if cell.row.federated else 1.4)
  if s.losses.size:
    ax_loss.plot(s.rounds, s.losses, marker="o" if s.losses.size <= MARKERS_UP_TO else None,
                 ms=2.5, **{**style, **(dict(lw=1.6, zorder=4) if s.failed else {})})
  if s.failed:
    _failed_marker(ax_loss, s, color, axis)
  if s.probe_accuracy.size:
    ax_acc.plot(s.probe_rounds, 100 * s.probe_accuracy, marker="o", ms=3, clip_on=False,
                **style)
    return True
  return False


def _loss_y_axis(ax_loss, axis) -> None:
  """The loss panel's y axis (`loss_axis`): log or symmetric log, its limits; "not run yet" where
  there is nothing to draw."""
  if axis is not None:
    linthresh, limits = axis
    if linthresh is None:
      ax_loss.set_yscale("log")
    else:
      ax_loss.set_yscale("symlog", linthresh=linthresh)
    ax_loss.set_ylim(*limits)
    if linthresh is None:
      _short_log_ticks(ax_loss, *limits)
  else:
    ax_loss.text(0.5, 0.5, "not run yet", transform=ax_loss.transAxes, ha="center", fontsize=8,
                 color="gray")


def _round_axis(ax_loss, drawn_here) -> None:
  """The shared x axis of a panel pair: rounds (steps) up to the longest series, symmetric-log where
  one row is WIDE_LENGTHS times as long as another."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  span = max([s.length for _, s in drawn_here] +
             [int(s.rounds.max()) for _, s in drawn_here if s.rounds.size] +
             [int(s.probe_rounds.max()) for _, s in drawn_here if s.probe_rounds.size] + [1])
  lengths = [s.length for _, s in drawn_here if s.length > 0]
  if lengths and max(lengths) > WIDE_LENGTHS * min(lengths):  # A short row beside long ones.
    ax_loss.set_xscale("symlog", linthresh=min(lengths), linscale=0.5)
  else:
    ax_loss.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
  ax_loss.set_xlim(0, span)


def _column_panels(fig, spec, column, drawn_here, colors, raw_pixels, curve_name: str,
                   first: bool) -> bool:
  """A column's loss panel over its probe panel in grid cell `spec`, with the raw-pixel line (where
  measured), titles and labels (y labels on the `first` column of a figure row); whether a run
  drawn in it failed."""
  pair = spec.subgridspec(2, 1, height_ratios=[1.1, 1])
  ax_loss = fig.add_subplot(pair[0])
  ax_acc = fig.add_subplot(pair[1], sharex=ax_loss)
  axis = loss_axis([s.losses for _, s in drawn_here if not s.failed],
                   [s.losses for _, s in drawn_here if s.failed])
  probes = 0
  for cell, s in drawn_here:
    probes += _draw_cell(ax_loss, ax_acc, cell, s, colors[cell.row.key], axis)
  _loss_y_axis(ax_loss, axis)
  if raw_pixels is not None:
    ax_acc.axhline(100 * raw_pixels, color="gray", ls=":", lw=1.2)
  elif not probes:
    ax_acc.text(0.5, 0.5, "no linear probe", transform=ax_acc.transAxes, ha="center", fontsize=8,
                color="gray")
  _round_axis(ax_loss, drawn_here)
  ax_loss.set_title(_wrap(f"{column.group} {column.label}".strip(), TITLE_WRAP), fontsize=9)
  ax_loss.tick_params(labelbottom=False, labelsize=7)
  ax_acc.tick_params(labelsize=7)
  ax_acc.set_xlabel("round (centralized: step)" + (", symlog" if ax_loss.get_xscale() == "symlog"
                                                   else ""), fontsize=8)
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3, which="major")
  if first:
    ax_loss.set_ylabel("training loss", fontsize=8)
    ax_acc.set_ylabel(_wrap(f"linear probe, % ({curve_name})", 34), fontsize=8)
  return any(s.failed for _, s in drawn_here)


def _row_label(row, todo, every) -> str:
  """A row's legend name, with the columns where its run failed ("(failed)": all of them)."""
  name = row.name
  own = [c for c in todo if c.row.key == row.key and every.get(c.path) is not None]
  failed = [c for c in own if every[c.path].failed]
  if failed:
    name += " (failed)" if len(failed) == len(own) else (
        f" (failed: {', '.join(c.column.key for c in failed)})")
  return name


def _legend_entries(table: Table, drawn, shown: set[str], todo, every, colors, any_failed: bool,
                    raw_pixels, curve_name: str) -> tuple[list, list[str]]:
  """(handles, labels) of the legend: each row drawn, then the failed-run marker, the raw-pixel line
  and the centralized rows' dashes where the figure has them."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  handles, labels = [], []
  for row in drawn:
    if row.key not in shown:
      continue
    handles.append(Line2D([], [], color=colors[row.key], ls="-" if row.federated else "--",
                          lw=1.4))
    labels.append(_wrap(_row_label(row, todo, every), LEGEND_WRAP))
  if any_failed:
    handles.append(Line2D([], [], **FAILED_STYLE))
    labels.append(_wrap("run failed: its last finite loss", LEGEND_WRAP))
  if raw_pixels is not None:
    handles.append(Line2D([], [], color="gray", ls=":", lw=1.2))
    labels.append(_wrap(f"raw pixels ({curve_name})", LEGEND_WRAP))
  if any(not table.row(key).federated for key in shown):
    handles.append(Line2D([], [], color="0.45", ls="--", lw=1.4))
    labels.append(_wrap("dashed: centralized (x: step)", LEGEND_WRAP))
  return handles, labels


def figure(table: Table, output_dir: str, todo, results, random_acc, raw_pixels=None):
  """The matplotlib Figure of curves.png (Agg canvas): per column a loss panel over a probe panel,
  up to PANELS_PER_ROW columns a row; its legend lies inside the figure, right of the panels."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  # Not drawn: supervised rows, and rows whose probes read other images than they trained on
  # (--probe_dataset: a pretraining on synthetic images that other rows start from).
  drawn = [r for r in table.rows if not r.supervised and not r.config.probe_dataset]
  colors = {r.key: COLORS[i % len(COLORS)] for i, r in enumerate(drawn)}
  todo = [c for c in todo if c.row.key in colors]
  every = {c.path: series(output_dir, c, results.get(c.path), random_acc) for c in todo}
  layout = _layout(len(table.columns), len(drawn))
  fig = Figure(figsize=(layout.width, layout.height), layout="constrained")
  FigureCanvasAgg(fig)
  # The legend has a column of its own at the right, the height of the figure: it hides no curve and
  # the layout keeps it inside the figure, under the title.
  grid = fig.add_gridspec(layout.nrows, layout.ncols + 1,
                          width_ratios=[PANEL_SIZE[0]] * layout.ncols + [layout.legend_w])
  ax_legend = fig.add_subplot(grid[:, layout.ncols])
  ax_legend.axis("off")
  any_failed = False
  shown: set[str] = set()
  curve_name = table.curve_evaluation.name if table.curve_evaluation is not None else "LARS"
  for i, column in enumerate(table.columns):
    r, c = divmod(i, layout.ncols)
    drawn_here = [(cell, every[cell.path]) for cell in _panel_cells(todo, column)
                  if every.get(cell.path) is not None]
    shown.update(cell.row.key for cell, _ in drawn_here)
    any_failed |= _column_panels(fig, grid[r, c], column, drawn_here, colors, raw_pixels,
                                 curve_name, first=c == 0)
  handles, labels = _legend_entries(table, drawn, shown, todo, every, colors, any_failed,
                                    raw_pixels, curve_name)
  if handles:
    ax_legend.legend(handles, labels, loc="upper left", borderaxespad=0, fontsize=layout.font,
                     frameon=False, handlelength=2.2, labelspacing=0.6)
  fig.suptitle(_wrap(f"{table.title} ({table.scale})", int(layout.width * 13)), fontsize=9)
  return fig


def plot(table: Table, output_dir: str, todo, results, random_acc, raw_pixels=None) -> str:
  """Writes output_dir/curves.png (whole or not at all) and returns its path."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  fig = figure(table, output_dir, todo, results, random_acc, raw_pixels)
  path = os.path.join(output_dir, "curves.png")
  fd, tmp = tempfile.mkstemp(dir=output_dir, prefix=".tmp-curves-", suffix=".png")
  try:
    with os.fdopen(fd, "wb") as f:
      fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path
