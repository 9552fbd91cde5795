"""FedU² (Liao et al., "Rethinking the Representation in Federated Unsupervised Learning with Non-IID
Data", CVPR 2024) as an add-on to FedAvg-style methods, its two halves each by a flag:

FUR (`--fedu2_fur`), its flexible uniform regularizer, a client term

    L = L_ssl + w (FUR(z1) + FUR(z2)),      w = `fedu2_fur_weight` (0.01, the authors' code)

on the projections of both views (`tff_ssl.losses.uniformity`), its random draws (reference points,
tangent points, directions) from the step's seed.

EUA (`--fedu2_eua`), its unified aggregation, a server stage: each client uploads its update g_k
(= Delta_k, the global model minus its trained one) and N_k beside it (a report); the server scales
each to unit norm and takes the min-norm point of their convex hull (MGDA: the direction that serves
every client's objective at once),

    lambda = argmin_{lambda in simplex} || sum_k lambda_k g_k / ||g_k|| ||^2   (from lambda_k = N_k / N)
    Delta  = sum_k lambda_k g_k / ||g_k||

which the server optimizer takes in place of the weighted mean (its learning rate sets the step's
length: the authors' code steps 2 Delta at server rate 8). It needs every client's whole update at
the server (K x P numbers a round: the paper's 10 clients of a ResNet-18, 450 MB), and it refuses
--dp and --secure_aggregation, whose sums it bypasses. The code's solver starts from N_k / N too and
returns it unchanged below 3 clients; `min_norm_weights` solves the problem for any K.

The whole add-on is this module and its line in `tff_ssl/methods/addons.py`.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.federated.client_work import ClientTerm
from tff_ssl.federated.server_stage import ServerStage
from tff_ssl.losses import uniformity

FUR = Field("fedu2_fur", False, "FedAvg-style methods: add FedU²'s flexible uniform regularizer "
            "(FUR) to the clients' loss.")
FUR_WEIGHT = Field("fedu2_fur_weight", 0.01, "FedU²: the weight of FUR in the clients' loss.",
                   lower=0, open_lower=True)
EUA = Field("fedu2_eua", False, "FedAvg-style methods: aggregate with FedU²'s EUA (each client's "
            "update at unit norm, combined by the min-norm weights) in place of the weighted mean.")
FIELDS = (FUR, FUR_WEIGHT, EUA)
SERVER_FIELDS = (EUA,)  # What turns on its server stage (`addons.SERVER_FIELDS`).

FUR_SALT = 0x0F02  # Folded into the step's seed: FUR's draws, apart from the views'.


@dataclasses.dataclass(frozen=True)
class UniformityTerm(ClientTerm):
  """w (FUR(z1) + FUR(z2)), each view with its own draws."""

  weight: float = 0.01
  key = "fedu2_fur"

  def loss(self, step, carried):
    del carried
    if step.seed is None:
      raise ValueError("FUR draws its reference points from the step's seed; this step has none")
    seed = tf.random.experimental.stateless_fold_in(step.seed, FUR_SALT)
    total = []
    for view, z in enumerate((step.outputs.z1, step.outputs.z2)):
      draws = uniformity.draws(tf.random.experimental.stateless_fold_in(seed, view),
                               tf.shape(z)[0], z.shape[-1])
      total.append(uniformity.fur_loss(z, *draws))
    return self.weight * tf.add_n(total), None


def terms(config) -> tuple[ClientTerm, ...]:
  """FUR's term where `config.fedu2_fur`."""
  return (UniformityTerm(config.fedu2_fur_weight),) if config.fedu2_fur else ()


def project_to_simplex(v: np.ndarray) -> np.ndarray:
  """The Euclidean projection of `v` onto {x >= 0, sum x = 1} (sort-based)."""
  u = np.sort(v)[::-1]
  cumulative = np.cumsum(u) - 1.0
  rho = np.nonzero(u - cumulative / np.arange(1, len(v) + 1) > 0)[0][-1]
  return np.maximum(v - cumulative[rho] / (rho + 1.0), 0.0)


def min_norm_weights(gram: np.ndarray, start: np.ndarray, max_steps: int = 20000,
                     tolerance: float = 1e-13) -> np.ndarray:
  """argmin over the simplex of lambda^T G lambda (G = `gram`, the unit updates' inner products), by
  accelerated projected gradient (FISTA) from `start`, in float64."""
  gram = np.asarray(gram, np.float64)
  lipschitz = 2.0 * max(float(np.linalg.eigvalsh(gram)[-1]), 1e-12)
  x = y = project_to_simplex(np.asarray(start, np.float64))
  t = 1.0
  for _ in range(max_steps):
    new = project_to_simplex(y - 2.0 * gram @ y / lipschitz)
    t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
    y = new + (t - 1.0) / t_new * (new - x)
    done = np.max(np.abs(new - x)) < tolerance
    x, t = new, t_new
    if done:
      break
  return x


def unified_update(updates: np.ndarray, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """EUA (module docstring) of the clients' flat updates ([K, P]) and sizes ([K]): (Delta [P],
  lambda [K]). A client whose update is 0 has no direction and gets weight 0."""
  updates = np.asarray(updates, np.float64)
  norms = np.linalg.norm(updates, axis=1)
  moved = norms > 0
  lam = np.zeros(len(updates))
  if not moved.any():
    return np.zeros(updates.shape[1]), lam
  unit = updates[moved] / norms[moved, None]
  start = np.asarray(examples, np.float64)[moved]
  lam[moved] = min_norm_weights(unit @ unit.T, start / start.sum())
  return lam[moved] @ unit, lam


@dataclasses.dataclass(frozen=True)
class UpdateReport(ClientTerm):
  """EUA's client side: the client's whole update (flat, float32) and N_k, uploaded as a report."""

  size: int
  key = "fedu2_eua"

  def report_spec(self, model):
    del model
    return collections.OrderedDict(update=tf.TensorSpec([self.size], tf.float32),
                                   examples=tf.TensorSpec([], tf.float32))

  def report(self, carried, upload):
    del carried
    return collections.OrderedDict(
        update=tf.cast(tf.concat([tf.reshape(u, [-1]) for u in upload.update], axis=0),
                       tf.float32),
        examples=tf.cast(upload.num_examples, tf.float32))


class UnifiedAggregation(ServerStage):
  """EUA's server side: the update the server optimizer takes is `unified_update` of the reports."""

  key = "fedu2_eua"
  changes_update = True  # The min-norm combination of the clients' updates replaces the aggregate.

  def __init__(self, size: int):
    self.size = size

  def terms(self):
    return (UpdateReport(self.size),)

  def before_optimizer(self, part, round_num, update, out):
    del round_num
    reports = out["reports"][self.key]
    flat, lam = unified_update(reports["update"], reports["examples"])
    shapes = [np.shape(u) for u in update]
    sizes = [int(np.prod(s)) for s in shapes]
    pieces = np.split(flat.astype(np.float32), np.cumsum(sizes)[:-1])
    new = [p.reshape(s) for p, s in zip(pieces, shapes)]
    return new, part, {"fedu2_eua_max_weight": np.float32(lam.max()),
                       "fedu2_eua_norm": np.float32(np.linalg.norm(flat))}


def validate(config) -> None:
  """EUA replaces the aggregate: an aggregation strategy or compression beside it would be ignored."""
  if config.fedu2_eua:
    for flag, value, default in (("aggregator", config.aggregator, "fedavg"),
                                 ("compression", config.compression, "none")):
      if value != default:
        raise ValueError(f"--fedu2_eua combines the clients' own updates in place of the "
                         f"aggregate, so --{flag}={value} would have no effect: drop one of the two")


def stages(config):
  """A maker of EUA's stage where `config.fedu2_eua` (of none otherwise), over the tensors a host's
  mask trains."""
  if not config.fedu2_eua:
    return lambda model, mask: ()
  return lambda model, mask: (UnifiedAggregation(
      sum(int(np.prod(s.shape)) for s in mask.select(model.weight_specs))),)
