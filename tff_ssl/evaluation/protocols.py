"""Evaluation protocols for pretrained encoders: linear probe (LARS, and tuned logistic regression),
kNN monitor, full fine-tuning, supervised baseline.

All of them train on a stratified, seeded fraction of the labeled train split (10%, 1%, 100%) and report
top-1 accuracy on the test split. DCCO's settings (Appendix B, 5K labels on CIFAR-100):
  linear probe   LARS, lr 2.0, momentum 0.9, cosine decay, batch 512, 1000 steps; features extracted once
                 from the frozen encoder.
  fine-tuning    Adam, lr 5e-3, cosine decay, batch 256, 100 steps; flip augmentation only.
  supervised     from scratch, Adam, lr 0.01, cosine decay, batch 256, 100 epochs; flips only.
The tuned linear probe (`TunedLinearProbeConfig`) is the one baselines and encoders are compared under:
multinomial logistic regression (L-BFGS, to convergence) on features standardized with the labeled
subset's statistics, its L2 strength chosen on a held-out part of the labeled subset, then refit on all
of it; the test split is used once, for the reported accuracy. The LARS probe above has neither a
regularizer nor a stopping rule and overfits raw pixels (issue 31: 80.1% at 1000 steps, 79.3% at 3000).
The kNN monitor (FedEMA's public code, after Wu et al. 2018's weighted kNN): every test feature votes
with its k = 200 most cosine-similar labeled train features, each weighted exp(similarity / 0.1).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from typing import Callable

import numpy as np
import tensorflow as tf

from tff_ssl import optim
from tff_ssl.data.augment import AugmentConfig, augment, to_float
from tff_ssl.data.sources import ImageSet
from tff_ssl.training.centralized import batch_indices
from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
VALIDATION_FRACTION = Field("validation_fraction", 0.0, "Hold this stratified fraction of train "
                            "out of pretraining and the probe's labels and report accuracy on it "
                            "instead of on test (hyperparameter selection never sees the test "
                            "split).", lower=0, upper=1, open_upper=True)
EVAL_LABEL_FRACTION = Field("eval_label_fraction", 0.1, "Labeled fraction for the linear probe.",
                            lower=0, upper=1, open_lower=True)
EVAL_STEPS = Field("eval_steps", 500, "Linear-probe training steps.", lower=1)
EVAL_LEARNING_RATE = Field("eval_learning_rate", 2.0, "Linear-probe LARS learning rate.",
                           lower=0, open_lower=True)



def labeled_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
  """Sorted indices of a stratified random `fraction` of the labeled examples.

  Each class keeps round(fraction * its count) examples, at least one.
  """
  if not 0 < fraction <= 1:
    raise ValueError(f"label fraction must be in (0, 1]; got {fraction}")
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  chosen = []
  for c in np.unique(labels[labels >= 0]):
    idx = np.flatnonzero(labels == c)
    k = max(1, int(round(fraction * idx.size)))
    chosen.append(rng.choice(idx, size=k, replace=False))
  if not chosen:
    raise ValueError("the split has no labeled examples to evaluate on")
  return np.sort(np.concatenate(chosen))


_feature_fns: "weakref.WeakKeyDictionary[tf.keras.Model, dict]" = weakref.WeakKeyDictionary()


def _encode(model_ref, images):
  return model_ref()(to_float(images), training=False)


def extract_features(encoder: tf.keras.Model, images: np.ndarray,
                     batch_size: int = 1000) -> np.ndarray:
  """The frozen encoder's features of uint8 `images`, float32 [N, D].

  The compiled forward pass is kept per encoder (and image shape and dtype), for any batch size: the
  protocols extract train and test features of one encoder several times, and tracing a full-width
  ResNet-18 costs more than its forward pass over a small split."""
  fns = _feature_fns.setdefault(encoder, {})
  key = (images.shape[1:], images.dtype.str)
  if key not in fns:
    spec = tf.TensorSpec((None,) + tuple(images.shape[1:]), tf.as_dtype(images.dtype))
    # The cached function must not keep its encoder alive (a weak reference), and is a partial, not a
    # lambda: TF counts retracing per Python code object, and one lambda traced once per encoder would
    # print its "triggered tf.function retracing" warning.
    fns[key] = tf.function(functools.partial(_encode, weakref.ref(encoder)),
                           input_signature=[spec])
  fn = fns[key]
  return np.concatenate([fn(tf.constant(images[i:i + batch_size])).numpy()
                         for i in range(0, images.shape[0], batch_size)])


@dataclasses.dataclass(frozen=True)
class LinearProbeConfig:
  label_fraction: float = 0.1
  steps: int = 1000
  batch_size: int = 512
  optimizer: str = "lars"
  learning_rate: float = 2.0
  seed: int = 0


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
  return float(np.mean(np.argmax(logits, axis=1) == labels))


class _LinearTrainer:
  """A linear softmax classifier on `dim` features and its optimizer, with their training step
  traced once: each fit starts from the same zero weights and fresh optimizer state (the values
  they were built with), so one trainer serves every probe of that shape and optimizer (a run
  probes its encoders several times; tracing the step cost more than 100 steps on small features).
  The classifier is two variables and Keras Dense's ops, not a Keras layer: a layer kept across TFF
  traces would be left in TF1's classes (`federated.functional._keras_classes`)."""

  def __init__(self, dim: int, num_classes: int, config: LinearProbeConfig):
    self.kernel = tf.Variable(tf.zeros([dim, num_classes]), name="linear/kernel")
    self.bias = tf.Variable(tf.zeros([num_classes]), name="linear/bias")
    self.weights = [self.kernel, self.bias]
    self.opt = optim.make_optimizer(config.optimizer, config.learning_rate, config.steps)
    self.opt.build(self.weights)
    self.variables = self.weights + list(self.opt.variables)
    self.start = [v.numpy() for v in self.variables]
    specs = [tf.TensorSpec([None, dim], tf.float32), tf.TensorSpec([None], tf.int64),
             tf.TensorSpec([None], tf.int64)]
    self.step = tf.function(self._step, input_signature=specs)

  def logits(self, x):
    return tf.nn.bias_add(tf.matmul(x, self.kernel), self.bias)

  def _step(self, x_all, y_all, idx):
    x, y = tf.gather(x_all, idx), tf.gather(y_all, idx)
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, self.logits(x)))
    self.opt.apply_gradients(zip(tape.gradient(loss, self.weights), self.weights))
    return loss

  def reset(self) -> None:
    for variable, value in zip(self.variables, self.start):
      variable.assign(value)


_trainers: dict = {}  # (dim, classes, optimizer, rate, steps) -> _LinearTrainer; the last few only.
_TRAINERS_KEPT = 8
_trainers_lock = threading.Lock()


def train_linear_classifier(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                            test_y: np.ndarray, num_classes: int,
                            config: LinearProbeConfig) -> float:
  """Fits a linear softmax classifier on fixed features; returns test top-1 accuracy."""
  tf.keras.utils.set_random_seed(config.seed)
  key = (train_x.shape[1], num_classes, config.optimizer, config.learning_rate, config.steps)
  with _trainers_lock:  # One fit at a time per trainer.
    trainer = _trainers.pop(key, None) or _LinearTrainer(train_x.shape[1], num_classes, config)
    _trainers[key] = trainer  # The newest last.
    while len(_trainers) > _TRAINERS_KEPT:
      del _trainers[next(iter(_trainers))]
    trainer.reset()
    batch = min(config.batch_size, train_x.shape[0])
    x_all = tf.constant(train_x, tf.float32)
    y_all = tf.constant(train_y, tf.int64)
    batches = batch_indices(train_x.shape[0], batch, config.seed)
    for _ in range(config.steps):
      trainer.step(x_all, y_all, tf.constant(next(batches), tf.int64))
    return _accuracy(trainer.logits(tf.constant(test_x, tf.float32)).numpy(), test_y)


def linear_probe(encoder: tf.keras.Model, train: ImageSet, test: ImageSet,
                 config: LinearProbeConfig = LinearProbeConfig()) -> float:
  """Linear-probe top-1 test accuracy of the frozen `encoder` on `config.label_fraction` labels."""
  idx = labeled_subset(train.labels, config.label_fraction, config.seed)
  train_x = extract_features(encoder, train.images[idx])
  test_x = extract_features(encoder, test.images)
  # Standardizing with the labeled subset's statistics makes one learning rate fit every encoder.
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  return train_linear_classifier((train_x - mean) / std, train.labels[idx], (test_x - mean) / std,
                                 test.labels, train.num_classes, config)


@dataclasses.dataclass(frozen=True)
class TunedLinearProbeConfig:
  """Multinomial logistic regression on standardized frozen features, its L2 strength tuned on the
  labeled subset alone.

  label_fraction: the stratified labeled subset of train (`labeled_subset`, from `seed`).
  l2_grid: candidate L2 strengths λ of the objective mean cross-entropy + λ/2·||W||² (independent of
    the subset's size); the one with the best held-out accuracy wins (ties: the strongest).
  holdout_fraction: the stratified part of the labeled subset the candidates are scored on; each is fit
    on the rest. The winner is then refit on the whole labeled subset.
  max_iterations: L-BFGS iterations per fit (scikit-learn's `LogisticRegression`, tolerance 1e-4).
  """
  label_fraction: float = 0.1
  l2_grid: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
  holdout_fraction: float = 0.2
  max_iterations: int = 1000
  seed: int = 0

  def __post_init__(self):
    if not 0 < self.label_fraction <= 1:
      raise ValueError(f"label fraction must be in (0, 1]; got {self.label_fraction}")
    if not self.l2_grid or any(not l2 > 0 for l2 in self.l2_grid):
      raise ValueError(f"l2_grid must hold L2 strengths > 0; got {self.l2_grid}")
    if not 0 < self.holdout_fraction < 1:
      raise ValueError(f"holdout_fraction must be in (0, 1); got {self.holdout_fraction}")
    if self.max_iterations < 1:
      raise ValueError(f"max_iterations must be >= 1; got {self.max_iterations}")


@dataclasses.dataclass(frozen=True)
class ProbeFit:
  """What a tuned probe chose and measured: the L2 strength, each candidate's held-out accuracy, and
  the refit classifier's test accuracy."""
  l2: float
  holdout_accuracy: dict[float, float]
  test_accuracy: float


def _fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, max_iterations: int):
  # pylint: disable=g-import-not-at-top
  import warnings
  from sklearn.exceptions import ConvergenceWarning
  from sklearn.linear_model import LogisticRegression
  # pylint: enable=g-import-not-at-top
  # scikit-learn minimizes C·Σ cross-entropy + ½||W||²: the same minimizer as mean + λ/2·||W||² for
  # C = 1 / (λ n). The bias is not penalized.
  model = LogisticRegression(C=1.0 / (l2 * x.shape[0]), max_iter=max_iterations, tol=1e-4)
  with warnings.catch_warnings():
    # A fit that stops at max_iterations is still a classifier; the held-out score judges it.
    warnings.simplefilter("ignore", ConvergenceWarning)
    return model.fit(x, y)


def tune_linear_classifier(train_x: np.ndarray, train_y: np.ndarray,
                           config: TunedLinearProbeConfig):
  """(the L2 strength chosen on a held-out part of the labeled `train_x`, each candidate's held-out
  accuracy, the classifier refit on all of `train_x`). Sees the labeled subset only. `train_x`:
  already standardized."""
  held = labeled_subset(train_y, config.holdout_fraction, config.seed + 1)
  fit = np.setdiff1d(np.arange(train_y.size), held)
  if fit.size == 0 or np.unique(train_y[fit]).size < 2:
    raise ValueError(f"{train_y.size} labeled examples leave too few to fit on after holding out "
                     f"{config.holdout_fraction:g} of them; raise label_fraction")
  scores = {}
  for l2 in config.l2_grid:
    model = _fit_logistic(train_x[fit], train_y[fit], l2, config.max_iterations)
    scores[l2] = float(np.mean(model.predict(train_x[held]) == train_y[held]))
  best = max(sorted(scores, reverse=True), key=lambda l2: scores[l2])  # Ties: the strongest.
  return best, scores, _fit_logistic(train_x, train_y, best, config.max_iterations)


def tuned_linear_probe_fit(encoder: tf.keras.Model, train: ImageSet, test: ImageSet,
                           config: TunedLinearProbeConfig = TunedLinearProbeConfig()) -> ProbeFit:
  """The tuned probe of the frozen `encoder` (module docstring), with what it chose."""
  idx = labeled_subset(train.labels, config.label_fraction, config.seed)
  train_x = extract_features(encoder, train.images[idx])
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  l2, scores, model = tune_linear_classifier((train_x - mean) / std, train.labels[idx], config)
  test_x = (extract_features(encoder, test.images) - mean) / std  # Only now: the test split.
  return ProbeFit(l2, scores, float(np.mean(model.predict(test_x) == test.labels)))


def tuned_linear_probe(encoder: tf.keras.Model, train: ImageSet, test: ImageSet,
                       config: TunedLinearProbeConfig = TunedLinearProbeConfig()) -> float:
  """Tuned linear-probe top-1 test accuracy of the frozen `encoder` (`tuned_linear_probe_fit`)."""
  return tuned_linear_probe_fit(encoder, train, test, config).test_accuracy


@dataclasses.dataclass(frozen=True)
class KNNConfig:
  label_fraction: float = 1.0  # The public code's monitor uses every labeled train image.
  k: int = 200
  temperature: float = 0.1
  seed: int = 0

  def __post_init__(self):
    if self.k < 1:
      raise ValueError(f"kNN k must be >= 1; got {self.k}")
    if not self.temperature > 0:
      raise ValueError(f"kNN temperature must be > 0; got {self.temperature}")


def knn_classify(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, num_classes: int,
                 k: int = 200, temperature: float = 0.1, batch_size: int = 1000) -> np.ndarray:
  """Weighted kNN predictions: for each row of `test_x`, the class with the largest sum of
  exp(cos / temperature) over its k most cosine-similar rows of `train_x` (k capped at their
  number). Ties in similarity go to the earlier train row."""
  k = min(k, train_x.shape[0])
  bank = tf.math.l2_normalize(tf.constant(train_x, tf.float32), axis=1)
  labels = tf.constant(train_y, tf.int32)

  @tf.function
  def predict(x):
    sim = tf.matmul(tf.math.l2_normalize(x, axis=1), bank, transpose_b=True)
    top, idx = tf.math.top_k(sim, k=k)
    votes = tf.one_hot(tf.gather(labels, idx), num_classes) * tf.exp(top / temperature)[..., None]
    return tf.argmax(tf.reduce_sum(votes, axis=1), axis=1, output_type=tf.int32)

  return np.concatenate([predict(tf.constant(test_x[i:i + batch_size], tf.float32)).numpy()
                         for i in range(0, test_x.shape[0], batch_size)])


def knn_monitor(encoder: tf.keras.Model, train: ImageSet, test: ImageSet,
                config: KNNConfig = KNNConfig()) -> float:
  """kNN-monitor top-1 test accuracy of the frozen `encoder` (labels: `config.label_fraction` of
  train)."""
  idx = labeled_subset(train.labels, config.label_fraction, config.seed)
  predicted = knn_classify(extract_features(encoder, train.images[idx]), train.labels[idx],
                           extract_features(encoder, test.images), train.num_classes, config.k,
                           config.temperature)
  return float(np.mean(predicted == test.labels))


@dataclasses.dataclass(frozen=True)
class FineTuneConfig:
  label_fraction: float = 0.1
  steps: int = 100
  batch_size: int = 256
  optimizer: str = "adam"
  learning_rate: float = 5e-3
  augment: AugmentConfig = AugmentConfig.flip_only()
  seed: int = 0


def _train_classifier(encoder: tf.keras.Model, train: ImageSet, test: ImageSet,
                      config: FineTuneConfig) -> float:
  idx = labeled_subset(train.labels, config.label_fraction, config.seed)
  images, labels = train.images[idx], train.labels[idx]
  head = tf.keras.layers.Dense(train.num_classes, name="classifier")
  head.build((None, encoder.output_shape[-1]))
  variables = encoder.trainable_variables + head.trainable_variables
  opt = optim.make_optimizer(config.optimizer, config.learning_rate, config.steps)

  @tf.function
  def step(x, ids, y, i):
    x = augment(x, tf.stack([tf.constant(config.seed, tf.int64), i]), config.augment, ids)
    with tf.GradientTape() as tape:
      logits = head(encoder(x, training=True))
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  batches = batch_indices(images.shape[0], min(config.batch_size, images.shape[0]), config.seed)
  for i in range(config.steps):
    b = next(batches)
    step(tf.constant(images[b]), tf.constant(b, tf.int64), tf.constant(labels[b]),
         tf.constant(i, tf.int64))
  predict = tf.function(lambda x: head(encoder(to_float(x), training=False)))
  logits = np.concatenate([predict(tf.constant(test.images[i:i + 1000])).numpy()
                           for i in range(0, len(test), 1000)])
  return _accuracy(logits, test.labels)


def fine_tune(encoder: tf.keras.Model, train: ImageSet, test: ImageSet,
              config: FineTuneConfig = FineTuneConfig()) -> float:
  """Fine-tunes a copy of `encoder` plus a linear head end to end; returns test top-1 accuracy."""
  copy = tf.keras.models.clone_model(encoder)
  copy.set_weights(encoder.get_weights())
  tf.keras.utils.set_random_seed(config.seed)
  return _train_classifier(copy, train, test, config)


def supervised_from_scratch(build_encoder: Callable[[], tf.keras.Model], train: ImageSet,
                            test: ImageSet, config: FineTuneConfig) -> float:
  """Trains a freshly initialized encoder plus a linear head on the labeled fraction."""
  tf.keras.utils.set_random_seed(config.seed)
  return _train_classifier(build_encoder(), train, test, config)


def raw_pixels(image_shape) -> tf.keras.Model:
  """The identity "encoder": an image's pixels (scaled to [0, 1]) as its features, flattened. Under a
  frozen-feature protocol it is the baseline a pretrained encoder must beat (a linear classifier or a
  kNN on raw pixels)."""
  return tf.keras.Sequential([tf.keras.Input(shape=tuple(image_shape)), tf.keras.layers.Flatten()],
                             name="raw_pixels")


# Protocols that evaluate frozen features: the ones a raw-pixel or random-init baseline makes sense for.
FROZEN_FEATURE_PROTOCOLS = (LinearProbeConfig, TunedLinearProbeConfig, KNNConfig)

# The protocol a config describes: what `evaluate` runs for it.
PROTOCOLS: dict[type, Callable] = {
    LinearProbeConfig: linear_probe,
    TunedLinearProbeConfig: tuned_linear_probe,
    KNNConfig: knn_monitor,
    FineTuneConfig: fine_tune,
}


def evaluate(encoder: tf.keras.Model, train: ImageSet, test: ImageSet, protocol) -> float:
  """Top-1 test accuracy of `encoder` under `protocol` (a `LinearProbeConfig`,
  `TunedLinearProbeConfig`, `KNNConfig` or `FineTuneConfig`)."""
  if type(protocol) not in PROTOCOLS:
    raise ValueError(f"no evaluation protocol for {type(protocol).__name__}; use one of "
                     f"{[t.__name__ for t in PROTOCOLS]}")
  return PROTOCOLS[type(protocol)](encoder, train, test, protocol)
