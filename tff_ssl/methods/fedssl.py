"""The generalized FedSSL framework of Zhuang et al. (ICLR 2022) with stateful clients: FedBYOL, FedU,
FedEMA, FedMoCo.

Every client keeps its own networks between the rounds it takes part in (`SiameseClientState`, in the
on-disk client-state store): the target network of BYOL / the momentum network of MoCo (never
uploaded, never aggregated: only the client's own EMA over its local steps moves it), MoCo's queue of
negative keys, and, for FedU and FedEMA, its online network (online
encoder = ResNet + projector, as BYOL's "encoder" in the authors' code, and the predictor). The online
network is uploaded and aggregated (N_k-weighted by default; any `tff_ssl.aggregators` strategy). What
differs between the methods is where a client's next local training starts, each method's rule an
`OnlineUpdate` in its own module:

  FedBYOL   online network <- the global one (encoder, projector and predictor); FedMoCo the same
            with MoCo's loss (no predictor)
  FedU      online encoder <- the global one; predictor <- the global one only if the divergence
            d = ||W_g - W_k|| of the online encoder is below `fedu_threshold` (0.4, the public code's),
            else the client keeps its own (divergence-aware predictor update). With an SSL method
            that has no predictor (SimCLR, Barlow Twins: L-DAWA's Table 2 runs FedU with them and
            says only that FedU "partially update[s] the model based on Euclidean distance"), the
            projector takes the predictor's part and d is the ResNet's divergence.
  FedEMA    W_k <- mu W_k + (1 - mu) W_g for the online encoder and the predictor, with
            mu = min(lambda_k d, 1): lambda_k constant (`fedema_lambda`, 0.8 in the paper) or the
            autoscaler lambda_k = tau / d at the first round where d is known (tau = 0.7), then fixed

A client's first participation starts from the global model (it has nothing of its own yet), with its
target network equal to it.

The divergence d (`divergence`):
  "paper"  ||W_g^r - W_k^{r-1}||: the L2 norm, over all online-encoder tensors (ResNet and projector)
           together, of the global model received minus the client's own online encoder after its last
           local training. The autoscaler's lambda_k = tau / d is set at the client's second
           participation (the first where it has both), so that round's mu is tau.
  "code"   the authors' public code (EasyFL): the mean over the ResNet's convolution kernels of the L2
           distance between the client's model at the start and at the end of its last local
           training; lambda_k = tau / d is set at the end of the client's first participation (the
           code's default tau is 0.8, `fedema_tau`).
FedU's ICCV 2021 paper is not among this project's sources; its threshold 0.4 is the public code's,
with the divergence measured as above.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.federated import client_state as client_state_lib
from tff_ssl.federated import fedavg_process, masks
from tff_ssl.federated import server_step
from tff_ssl.methods import fedavg
from tff_ssl.method import Method

DIVERGENCES = ("paper", "code")

# The framework's config field (FedU and FedEMA read it; their own fields are in their modules).
DIVERGENCE_MEASURE = Field("divergence_measure", "paper", "FedU/FedEMA: divergence ||W_g - W_k|| "
                           "of the online encoder (paper) or the public code's mean over conv "
                           "kernels of the client's last local change (code).", choices=DIVERGENCES)


class OnlineUpdate:
  """Where a client's online network starts a round: FedBYOL's rule, the global network. A method
  whose clients keep their own online network (FedU, FedEMA) declares its rule in its module as a
  subclass (frozen dataclass) with `keeps_online = True`."""

  keeps_online = False

  def check(self, client: "SiameseClientState") -> None:
    """ValueError where the model cannot take this rule (e.g. FedU's needs a head)."""

  def start(self, client: "SiameseClientState", state, own: list, glob: list, returning: tf.Tensor,
            d: tf.Tensor) -> tuple[list, tf.Tensor, tf.Tensor, tf.Tensor]:
    """(the exchanged tensors local training starts from, mu, d, the client's scale) for a client
    with its own online network `own` and the global `glob`; `returning`: it has taken part before;
    `d`: its divergence (0 for a new client)."""
    raise NotImplementedError

  def scale_after(self, state, d: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """The client's scale once its local training's divergence `d` is known ("code" divergence)."""
    del state, d
    return scale


GLOBAL = OnlineUpdate()  # FedBYOL, FedMoCo.


@dataclasses.dataclass(frozen=True)
class StatefulConfig:
  """How a client's online network starts a round (see the module docstring).

  online_update: the rule (`OnlineUpdate`): `GLOBAL` (FedBYOL, FedMoCo), FedU's, FedEMA's.
  divergence: "paper" or "code".
  """

  online_update: OnlineUpdate = GLOBAL
  divergence: str = "paper"

  def __post_init__(self):
    if not isinstance(self.online_update, OnlineUpdate):
      raise ValueError(f"online_update must be an OnlineUpdate; got {self.online_update!r}")
    DIVERGENCE_MEASURE.check(self.divergence)

  @property
  def keeps_online(self) -> bool:
    """Whether the client's own online network is part of its state."""
    return self.online_update.keeps_online


def _norm(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t)) for t in tensors]))


class SiameseClientState(client_state_lib.ClientState):
  """A client's own networks in the generalized framework (module docstring).

  The state (one client):
    rounds      how many rounds the client has taken part in (0: a new client)
    online      its online network after its last local training (the exchanged tensors; FedU and
                FedEMA only)
    target      its BYOL target / MoCo momentum network (all the model's tensors; SSL methods with
                one only)
    queue       MoCo's queue of negative keys (MoCo only)
    scale       FedEMA's autoscaler lambda_k (0 until set)
    divergence  d at the start of its last round ("paper") or of its last local training ("code")
    mu          the weight of its own online network at the start of its last round (FedEMA's mu;
                FedU: 1 if it kept its predictor; FedBYOL and a first round: 0)
  """

  def __init__(self, names: Sequence[str], mask: masks.TensorMask, config: StatefulConfig,
               ema_target: bool, queue_size: int = 0):
    self.config = config
    self.ema_target = ema_target
    self.queue_size = queue_size  # > 0: MoCo's queue of negative keys is kept too.
    self.mask = mask
    trained_names = mask.select(list(names))
    # Positions within the exchanged tensors: the online encoder (ResNet + projector), the predictor,
    # and the ResNet's convolution kernels (the "code" divergence).
    # FedU's divergence-aware head: the predictor; a model without one (SimCLR, Barlow Twins:
    # L-DAWA's FedU rows) keeps its projector instead, the divergence then being the ResNet's.
    head = "predictor/" if any(n.startswith("predictor/") for n in trained_names) else "projector/"
    self.head = [i for i, n in enumerate(trained_names) if n.startswith(head)]
    self.encoder = [i for i, n in enumerate(trained_names) if not n.startswith(head)]
    self._conv = [i for i, n in enumerate(trained_names)
                  if n.startswith("encoder/") and "conv" in n and n.endswith("kernel")]
    config.online_update.check(self)
    if config.divergence == "code" and not self._conv:
      raise ValueError("the 'code' divergence averages over convolution kernels; the model "
                       "exchanges none")

  def spec(self, model):
    scalar = tf.TensorSpec([], tf.float32)
    out = collections.OrderedDict(rounds=scalar)
    if self.config.keeps_online:
      out["online"] = list(self.mask.select(model.weight_specs))
    if self.ema_target:
      out["target"] = list(model.weight_specs)
    if self.queue_size:
      out["queue"] = tf.TensorSpec([self.queue_size, model.output_dims[0]], tf.float32)
    out.update(scale=scalar, divergence=scalar, mu=scalar)
    return out

  def measurements(self, states):
    """Of a round's clients that keep their own online network (FedU, FedEMA) and had one, i.e. had
    taken part before: `client_divergence`, their mean d; `client_own_weight`, their mean mu (FedU:
    the fraction that kept their own predictor; FedEMA: the weight of their own network). NaN in a
    round with no such client."""
    if not self.config.keeps_online:
      return {}
    returning = [s for s in states if float(s["rounds"]) > 1]  # Counted after this round.
    mean = lambda key: np.float32(np.mean([float(s[key]) for s in returning]) if returning
                                  else np.nan)
    return {"client_divergence": mean("divergence"), "client_own_weight": mean("mu")}

  # The start of a round, computed in `begin` and again in `end` (which stores mu and lambda_k).
  def _paper_divergence(self, state, trained_global):
    return _norm([trained_global[i] - state["online"][i] for i in self.encoder])

  def _start(self, state, trained_global: list) -> tuple[list, tf.Tensor, tf.Tensor, tf.Tensor]:
    """(the exchanged tensors local training starts from, mu, divergence d, lambda_k)."""
    cfg = self.config
    zero = tf.constant(0.0)
    if not cfg.keeps_online:
      return list(trained_global), zero, zero, state["scale"]
    returning = tf.greater(state["rounds"], 0.0)
    d = (self._paper_divergence(state, trained_global) if cfg.divergence == "paper"
         else state["divergence"])
    d = tf.where(returning, d, 0.0)  # A new client has no network of its own.
    return cfg.online_update.start(self, state, state["online"], trained_global, returning, d)

  def begin(self, state, weights, context=None):
    del context
    start, _, _, _ = self._start(state, self.mask.select(list(weights)))
    return self.mask.merge(start, list(weights))

  def ssl_state(self, state, start, context=None, client_id=None):
    """A returning client's own target network (and queue); a new one's: `start` (and zeros, the
    stored initial value)."""
    del context, client_id
    out = {}
    returning = tf.greater(state["rounds"], 0.0)
    if self.ema_target:
      out["target"] = [tf.where(returning, t, s) for t, s in zip(state["target"], start)]
    if self.queue_size:
      out["queue"] = state["queue"]
    return out

  def end(self, state, weights, delta, num_examples, loss, ssl_state=None, context=None):
    del num_examples, loss, context
    start, mu, d, scale = self._start(state, list(weights))
    trained = [w - u for w, u in zip(weights, delta)]
    if self.config.divergence == "code":  # Of this local training, used at the next round.
      d = tf.add_n([tf.norm(start[i] - trained[i]) for i in self._conv]) / len(self._conv)
      scale = self.config.online_update.scale_after(state, d, scale)
    out = collections.OrderedDict(rounds=state["rounds"] + 1.0)
    if self.config.keeps_online:
      out["online"] = trained
    if self.ema_target:
      out["target"] = list(ssl_state["target"])
    if self.queue_size:
      out["queue"] = ssl_state["queue"]
    out.update(scale=tf.convert_to_tensor(scale, tf.float32), divergence=d, mu=mu)
    return out


# Fields every stateful method reads beyond FedAvg's: none (FedU and FedEMA add theirs).
FIELDS = fedavg.FIELDS
SSL = ("byol",)  # FedBYOL, FedU and FedEMA are BYOL's federated forms.


def build(config, model, image_shape, context=None):
  """The FedAvg-style process of `config` whose clients keep a `SiameseClientState`."""
  del context  # The server trains on nothing of its own.
  fedavg_config, aggregator, simulation, stages, stateful = config.parsed
  mask = masks.TensorMask.of_model(model)  # Every tensor but the frozen ones.
  method = fedavg_config.method
  state = SiameseClientState(model.names, mask, stateful, method.ema_target,
                             fedavg_config.hparams.moco_queue if method.queue else 0)
  return fedavg_process.FedAvgSSLProcess(
      model, image_shape, server_step.server_optimizer_for(config, model.names), fedavg_config,
      aggregator.build(model), simulation, client_state=state,
      stages=stages.of(model, mask))  # --fedfoa's bank, EUA.


def method(name: str, stateful_of, summary: str, fields: tuple[Field, ...] = (),
           ssl: tuple[str, ...] = SSL) -> Method:
  """The registry entry of a method of this framework; `stateful_of(config)` gives its
  `StatefulConfig` (validated when the config is made)."""

  def validate(config):
    return fedavg.process_config(config) + (stateful_of(config),)

  return Method(name=name, kind="federated", fields=FIELDS + fields, ssl=ssl,
                validate=validate, build=build,
                min_samples=fedavg.METHOD.min_samples,
                divergence_hint=fedavg.divergence_hint, summary=summary)
