"""The clients' optimizer steps every federated process shares: the client optimizer, its learning
rate over the run (`ClientSchedule`), one step (`client_step`) and the steps of a client's local
training on a loss of the current weights (`train`), with the fields that set them."""

from __future__ import annotations

import dataclasses

import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import optim
from tff_ssl.config_fields import Field
from tff_ssl.federated.masks import TensorMask


# The fields of the clients' local training every federated method reads (their one check).
LOCAL_STEPS = Field("local_steps", 1, "Local steps per round (FedAvg-style methods: local epochs, "
                    "one full-batch step each unless --local_batch_size).", lower=1)
CLIENT_OPTIMIZER = Field("client_optimizer", "sgd", "Client optimizer (tff_ssl.optim): plain "
                         "gradient descent (DCCO's), with momentum 0.9, or AdamW (LW-FedSSL's).",
                         choices=lambda: optim.names("client"))
CLIENT_LEARNING_RATE = Field("client_learning_rate", 1.0, "Client learning rate (the peak, with "
                             "--client_lr_schedule=warmup_cosine).", lower=0, open_lower=True)
CLIENT_LR_SCHEDULES = ("constant", "warmup_cosine")
CLIENT_LR_SCHEDULE = Field("client_lr_schedule", "constant", "FedAvg-style: the clients' learning "
                           "rate over the run: constant, or warmup_cosine (MoCo v3's: a linear "
                           "warm-up over --warmup_fraction of the rounds, then cosine decay to 0; "
                           "a client's step s of S in round r is at progress (r + s / S) / rounds, "
                           "across rounds and stages).", choices=CLIENT_LR_SCHEDULES)


@dataclasses.dataclass(frozen=True)
class ClientSchedule:
  """The clients' learning rate over a run of `rounds` rounds (`CLIENT_LR_SCHEDULE`): constant at
  `learning_rate`, or `learning_rate` * `optim.warmup_cosine` of the run's progress, a function of
  the round and of the step within it, so a resumed run (or a stage of a layer-wise one) continues
  where it was."""

  learning_rate: float
  kind: str = "constant"
  rounds: int = 1
  warmup_fraction: float = 0.0

  def __post_init__(self):
    CLIENT_LEARNING_RATE.check(self.learning_rate)
    CLIENT_LR_SCHEDULE.check(self.kind)
    optim.WARMUP_FRACTION.check(self.warmup_fraction)
    if self.rounds < 1:
      raise ValueError(f"rounds must be >= 1; got {self.rounds}")
    if self.kind == "constant" and self.warmup_fraction:
      raise ValueError(f"warmup_fraction ({self.warmup_fraction}) needs "
                       f"--client_lr_schedule=warmup_cosine")

  @property
  def constant(self) -> bool:
    return self.kind == "constant"

  def progress(self, round_num, step, steps):
    """The run's progress at step `step` of `steps` in round `round_num` (0-based)."""
    return (round_num + step / steps) / self.rounds

  def rate(self, round_num, step, steps):
    """The learning rate of step `step` (of `steps`) in round `round_num`: plain numbers or
    tensors."""
    if self.constant:
      return self.learning_rate
    return self.learning_rate * optim.warmup_cosine(self.progress(round_num, step, steps),
                                                    self.warmup_fraction)


def with_learning_rate(optimizer: tff.learning.optimizers.Optimizer, state, learning_rate):
  """`optimizer`'s `state` with its learning rate set to `learning_rate` (a scheduled step)."""
  hparams = dict(optimizer.get_hparams(state))
  hparams["learning_rate"] = tf.cast(learning_rate, tf.convert_to_tensor(
      hparams["learning_rate"]).dtype)
  return optimizer.set_hparams(state, hparams)


def client_optimizer(name: str, learning_rate: float,
                     weight_decay: float = 0.0) -> tff.learning.optimizers.Optimizer:
  """The clients' local optimizer (`tff_ssl.optim`, role "client"), restarted every round: plain
  gradient descent ("sgd", the papers' choice, and what DCCO's equivalence needs), SGD with
  momentum 0.9 ("sgdm"), or AdamW ("adamw", LW-FedSSL's: TFF's, with `weight_decay` decoupled,
  w -= lr * (Adam's step + wd * w)). The SGD optimizers take weight decay as coupled L2 in
  `client_step` (`coupled_weight_decay`)."""
  return optim.make_tff_optimizer(name, "client", learning_rate, weight_decay=weight_decay)


def coupled_weight_decay(name: str, weight_decay: float) -> float:
  """The L2 term `client_step` adds to the gradients: the weight decay of the SGD optimizers;
  AdamW's is decoupled, inside the optimizer."""
  return 0.0 if optim.get(name, "client").decoupled_weight_decay else weight_decay


def client_step(optimizer: tff.learning.optimizers.Optimizer, opt_state, trained: list, loss_of,
                weight_decay: float = 0.0):
  """The one local-training step of every client: `loss_of(trained)`, its gradient with respect to
  the trained tensors (+ weight_decay * w: coupled L2, as PyTorch's SGD), one optimizer step.

  Returns (optimizer state, trained tensors after the step, the loss before it).
  """
  with tf.GradientTape() as tape:
    tape.watch(trained)
    loss = loss_of(trained)
  grads = tape.gradient(loss, trained)
  if weight_decay:
    grads = [g + weight_decay * w for g, w in zip(grads, trained)]
  opt_state, new = optimizer.next(opt_state, tuple(trained), tuple(grads))
  return opt_state, list(new), loss


def train(weights, steps: int, optimizer: str, learning_rate, loss_of,
                   after_step=None, weight_decay: float = 0.0, mask: TensorMask | None = None):
  """`steps` client optimizer steps (`client_step`) from `weights` on `loss_of(current_weights,
  step)`, training only the tensors of `mask` (default: all). `learning_rate`: a number, or a
  function of the step (a schedule: `ClientSchedule.rate`).

  `after_step(current_weights)` runs after each step (BYOL's target update).

  Returns (Delta = trained weights before - after, the first step's loss, the mean loss over the
  steps): what a client sends back, its loss at the broadcast model, and its mean training loss.
  """
  full = list(weights)
  mask = mask or TensorMask.all(len(full))
  initial = mask.select(full)
  current = list(initial)
  scheduled = callable(learning_rate)
  # A scheduled rate is set before each step (`with_learning_rate`); 1.0 is never used.
  local_opt = client_optimizer(optimizer, 1.0 if scheduled else learning_rate, weight_decay)
  opt_state = local_opt.initialize(tuple(tf.TensorSpec(w.shape, w.dtype) for w in current))
  step_losses = []
  for step in range(steps):
    if scheduled:
      opt_state = with_learning_rate(local_opt, opt_state, learning_rate(step))
    opt_state, current, loss = client_step(
        local_opt, opt_state, current,
        lambda trained, step=step: loss_of(mask.merge(trained, full), step),
        coupled_weight_decay(optimizer, weight_decay))
    step_losses.append(loss)
    if after_step is not None:
      after_step(mask.merge(current, full))
  return ([a - b for a, b in zip(initial, current)], step_losses[0],
          tf.add_n(step_losses) / float(steps))


def check_client_training(local_steps: int, optimizer: str, learning_rate: float) -> None:
  """Validates the client-side training settings every process shares (their fields' checks)."""
  LOCAL_STEPS.check(local_steps)
  CLIENT_OPTIMIZER.check(optimizer)
  CLIENT_LEARNING_RATE.check(learning_rate)
