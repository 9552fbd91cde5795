"""What crosses the wire from a client in a round, and what it costs in accuracy: each privacy /
compression setting's aggregation of a FedAvg-style update (`bin/benchmark --wire`).

For each setting the aggregation process is built as a run builds it (`AggregatorConfig.build`, the
reference simulation: one real client per TFF client) over the model's update, and

  upload_bytes  what one client sends per round, read from the computation's types (`cost.upload_bytes`:
                the CLIENTS argument of every aggregation intrinsic it calls)
  upload_ratio  over the plain FedAvg aggregation's
  max_error     the largest |entry| of (aggregate - exact mean of the same clients' updates), on
                `clients` random updates of norm 0.5 (inside DP's clip of 1)
  error_std     their standard deviation (DP: the noise's, to compare with sigma C / K)
  error_bound   what the setting promises: the secure sum's quantization (`secure_sum_bound`), the
                encoded sum's (a tensor's range / (2^bits - 1) per entry: stochastic rounding, tensors of more than
                20,000 entries), DP's noise (sigma C / K: its standard deviation, not a bound);
                0: exact
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tff_ssl import aggregators, cost
from tff_ssl.federated import common
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.privacy import PrivacyConfig

WIRE_FIELDS = ("setting", "clients", "parameters", "upload_bytes", "upload_ratio", "max_error",
               "error_std", "error_bound")


def settings(clients: int) -> dict[str, PrivacyConfig]:
  base = PrivacyConfig(population=max(clients, 2), clients_per_round=clients)
  dp = dataclasses.replace(base, dp="gaussian_fixed", noise_multiplier=1.0, clip=1.0)
  return collections.OrderedDict([
      ("plain", base),
      ("quantize8", dataclasses.replace(base, compression="quantize8")),
      ("quantize4", dataclasses.replace(base, compression="quantize4")),
      ("secure", dataclasses.replace(base, secure_aggregation=True)),
      ("dp", dp),
      ("dp+secure", dataclasses.replace(dp, secure_aggregation=True)),
  ])


def _updates(specs, clients: int, seed: int = 0) -> list[list[np.ndarray]]:
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(clients):
    parts = [rng.normal(size=s.shape.as_list()).astype(np.float32) for s in specs]
    norm = np.sqrt(sum(float(np.sum(p * p)) for p in parts))
    out.append([p * (0.5 / norm) for p in parts])
  return out


def measure_wire(model_builder, *, clients: int = 10, log=print) -> list[dict]:
  """One row per setting (module docstring) for the model `model_builder` builds."""
  model = FunctionalModel(model_builder)
  specs = model.weight_specs
  u_type = common.tensors_type(specs)
  updates = _updates(specs, clients)
  exact = [np.mean([u[t] for u in updates], axis=0) for t in range(len(specs))]
  infos = [collections.OrderedDict(num_examples=np.float32(1.0), loss=np.float32(1.0),
                                   model=[np.zeros(s.shape, np.float32) for s in specs])
           for _ in updates]
  rows, plain = [], None
  for name, privacy in settings(clients).items():
    log(f"{name} ...")
    config = aggregators.AggregatorConfig(name="uniform", privacy=privacy)
    factory = config.build(model)
    process = factory.create(u_type, aggregators.client_info_type(u_type))
    size = cost.upload_bytes(process.next)["total"]
    plain = plain or size
    out = process.next(process.initialize(), updates, infos)
    diffs = np.concatenate([(np.asarray(r) - e).ravel() for r, e in zip(out.result, exact)])
    rows.append({"setting": name, "clients": clients,
                 "parameters": sum(s.shape.num_elements() for s in specs),
                 "upload_bytes": size, "upload_ratio": round(size / plain, 4),
                 "max_error": float(np.max(np.abs(diffs))), "error_std": float(np.std(diffs)),
                 "error_bound": _bound(privacy, clients, updates)})
  return rows


# tff.learning.secure_aggregator's first bound (its quantile estimate's initial value, TFF 0.87):
# entries are clipped to [-50, 50] in a first round.
SECURE_INITIAL_BOUND = 50.0


def secure_sum_bound(value_range: float) -> float:
  """The error TFF's quantized secure sum allows per entry of a mean, for values within a range of
  `value_range`: rounding to 32 bits (range / (2^32 - 1) / 2 per client, and so per mean) and the
  float32 arithmetic of the (de)quantization (range * 2^-23; TFF: "7-8 significant digits relative
  to the range")."""
  return value_range / (2 ** 32 - 1) / 2 + value_range * 2.0 ** -23


def _bound(privacy: PrivacyConfig, clients: int, updates) -> float:
  if privacy.enabled:
    return privacy.noise_multiplier * privacy.clip / clients  # The noise's std.
  if privacy.secure_aggregation:
    return secure_sum_bound(2 * SECURE_INITIAL_BOUND)
  bits = {"quantize8": 8, "quantize4": 4}.get(privacy.compression)
  if bits:  # Per tensor: its own [min, max] in 2^bits - 1 steps, rounded stochastically (tensors
    # above 20,000 entries): at most one step per client, and so per mean.
    spreads = [float(np.ptp(u[t])) for u in updates for t in range(len(u))
               if u[t].size > 20000]
    return max(spreads, default=0.0) / (2 ** bits - 1)
  return 0.0


def format_wire_table(rows) -> str:
  lines = ["| setting | upload bytes / client / round | ratio | max error | error std | "
           "bound (DP: noise std) |", "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['setting']} | {r['upload_bytes']:,} | {r['upload_ratio']:.3f} | "
                 f"{r['max_error']:.2e} | {r['error_std']:.2e} | {r['error_bound']:.2e} |")
  return "\n".join(lines)
