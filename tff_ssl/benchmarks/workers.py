"""Rounds across TFF worker services: the grouped round of a scenario on the local context, then
across 1, 2, ... executor services (`bin/benchmark --workers` / `--local_workers`), with the bytes a
round moves on the wire, counted from each computation's arguments and result (`call_bytes`,
`round_bytes`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import runtime
from tff_ssl.benchmarks.common import Scenario, build_process, median_time, round_clients
from tff_ssl.federated.functional import FunctionalModel

WORKER_FIELDS = ("scenario", "workers", "group_size", "round_s", "ratio_to_local", "server_bytes",
                 "client_data_bytes", "result_bytes", "bytes_per_worker", "bytes_per_round")


def _nbytes(value) -> int:
  """Bytes of the tensors in a computation's argument or result (nested containers of arrays)."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.common_libs import structure
  # pylint: enable=g-import-not-at-top
  if isinstance(value, structure.Struct):
    return sum(_nbytes(v) for _, v in structure.to_elements(value))
  if isinstance(value, dict):
    return sum(_nbytes(v) for v in value.values())
  if isinstance(value, (list, tuple)):
    return sum(_nbytes(v) for v in value)
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
  if value is None:
    return 0
  return int(np.asarray(value).nbytes)


def call_bytes(comp, arg, result) -> dict:
  """What one call of a TFF computation moves: its SERVER (and unplaced) arguments, which every worker
  receives whole; its CLIENTS arguments, which the workers share; its result, which each worker
  returns as a partial aggregate of the same type for the driver to merge."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.common_libs import structure
  # pylint: enable=g-import-not-at-top
  param = comp.type_signature.parameter
  if param is None:
    pairs = []
  elif isinstance(param, tff.StructType) and isinstance(arg, structure.Struct):
    pairs = list(zip([t for _, t in structure.to_elements(param)],
                     [v for _, v in structure.to_elements(arg)]))
  else:
    pairs = [(param, arg)]
  out = {"server_bytes": 0, "client_data_bytes": 0, "result_bytes": _nbytes(result)}
  for t, v in pairs:
    at_clients = isinstance(t, tff.FederatedType) and t.placement is tff.CLIENTS
    out["client_data_bytes" if at_clients else "server_bytes"] += _nbytes(v)
  return out


def _recording_context(inner, calls: list):
  """A TFF context that runs every computation on `inner` and appends its `call_bytes` to `calls`."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_base
  # pylint: enable=g-import-not-at-top

  class Recording(context_base.SyncContext):

    def invoke(self, comp, arg):
      result = inner.invoke(comp, arg)
      calls.append(call_bytes(comp, arg, result))
      return result

  return Recording()


def round_bytes(calls: list[dict], workers: int) -> dict:
  """A round's traffic over `workers` workers (at least one: the local context's own service), on
  paper from its calls: each worker gets the SERVER arguments whole and 1/workers of the clients' data,
  and sends back one partial result."""
  w = max(1, workers)
  total = {k: sum(c[k] for c in calls) for k in ("server_bytes", "client_data_bytes",
                                                   "result_bytes")}
  total["bytes_per_worker"] = (total["server_bytes"] + total["result_bytes"] +
                               total["client_data_bytes"] / w)
  total["bytes_per_round"] = w * (total["server_bytes"] + total["result_bytes"]) + total[
      "client_data_bytes"]
  return total


def run_workers_scenario(scenario: Scenario, images: np.ndarray, model_builder,
                         targets: list[str], *, warmup: int = 2, rounds: int = 5,
                         log=print) -> list[dict]:
  """The grouped round of `scenario` on the local context, then across the first 1, 2, ...
  len(targets) workers (one slot of ceil(clients / workers) clients each); rows of `WORKER_FIELDS`.
  The local context is configured again at the end."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  # pylint: enable=g-import-not-at-top
  image_shape = images.shape[1:]
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  rows = []
  try:
    for w in range(len(targets) + 1):
      runtime.configure_context(workers=targets[:w])
      group_size = 0 if w == 0 else -(-scenario.clients // w)
      # Built with the context configured: across workers (w > 0) the rounds run under TFF's
      # mergeable execution (`process.BuildContext.mergeable`).
      process = build_process(scenario, model, image_shape, "grouped", group_size)
      state = [process.initialize()]
      calls = []

      def one_round(r, process=process, state=state, calls=calls):
        if r == 0:  # The traffic of one (untimed) round.
          stack = context_stack_impl.context_stack
          with stack.install(_recording_context(stack.current, calls)):
            state[0], _ = process.next(state[0], round_clients(images, scenario, r))
        else:
          state[0], _ = process.next(state[0], round_clients(images, scenario, r))

      row = {"scenario": scenario.name, "workers": w, "group_size": group_size,
             "round_s": median_time(one_round, warmup, rounds)}
      row.update(round_bytes(calls, w))
      row["ratio_to_local"] = row["round_s"] / rows[0]["round_s"] if rows else 1.0
      rows.append(row)
      log(f"  {scenario.name}: {'local' if w == 0 else f'{w} worker(s)'} "
          f"{row['round_s']:.3f} s/round")
  finally:
    runtime.configure_context(workers=[])
  return rows


def format_workers_table(rows: list[dict]) -> str:
  mb = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
  lines = ["| scenario | workers | clients per slot | round s | ÷ local | SERVER args MB | "
           "client data MB | results MB | MB per worker | MB per round |", "|" + "---|" * 10]
  for r in rows:
    lines.append(f"| {r['scenario']} | {r['workers'] or 'local'} | {r['group_size'] or 'all'} | "
                 f"{r['round_s']:.3f} | {r['ratio_to_local']:.2f} | {mb(r['server_bytes'])} | "
                 f"{mb(r['client_data_bytes'])} | {mb(r['result_bytes'])} | "
                 f"{mb(r['bytes_per_worker'])} | {mb(r['bytes_per_round'])} |")
  return "\n".join(lines)
