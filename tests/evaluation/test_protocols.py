"""Evaluation protocols: stratified label subsets, linear probe, fine-tuning, supervised baseline."""

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import evaluation, models
from tff_ssl.evaluation import FineTuneConfig, LinearProbeConfig
from tests import spread


def test_labeled_subset_is_stratified_and_seeded():
  labels = np.repeat(np.arange(10), 100)
  idx = evaluation.labeled_subset(labels, 0.1, seed=0)
  assert np.bincount(labels[idx]).tolist() == [10] * 10
  np.testing.assert_array_equal(idx, evaluation.labeled_subset(labels, 0.1, seed=0))
  assert not np.array_equal(idx, evaluation.labeled_subset(labels, 0.1, seed=1))
  assert np.bincount(labels[evaluation.labeled_subset(labels, 0.001, seed=0)]).tolist() == [1] * 10
  assert evaluation.labeled_subset(labels, 1.0, seed=0).tolist() == list(range(1000))
  with pytest.raises(ValueError, match=r"label fraction must be in \(0, 1\]; got 0"):
    evaluation.labeled_subset(labels, 0, seed=0)


def test_knn_votes_by_hand():
  # Test point along (1, 0). Train cosines: 1.0 (class 0), 0.8 (class 1), 0.6 (class 1), -1 (class 2).
  train_x = np.array([[2.0, 0.0], [0.8, 0.6], [0.6, 0.8], [-1.0, 0.0]])
  train_y = np.array([0, 1, 1, 2])
  test_x = np.array([[3.0, 0.0]])
  # k = 3, t = 0.1: class 0 gets e^10, class 1 gets e^8 + e^6 < e^10: class 0.
  assert evaluation.knn_classify(train_x, train_y, test_x, 3, k=3, temperature=0.1).tolist() == [0]
  # t = 10: e^0.1 = 1.105 against e^0.08 + e^0.06 = 2.145: class 1.
  assert evaluation.knn_classify(train_x, train_y, test_x, 3, k=3, temperature=10.0).tolist() == [1]
  # k = 1: the nearest alone; k above the bank's size is capped.
  assert evaluation.knn_classify(train_x, train_y, test_x, 3, k=1).tolist() == [0]
  assert evaluation.knn_classify(train_x, train_y, -test_x, 3, k=1).tolist() == [2]
  assert evaluation.knn_classify(train_x, train_y, test_x, 3, k=50, temperature=10.0).tolist() == [1]


def test_knn_matches_a_loop_over_test_points():
  rng = np.random.default_rng(3)
  train_x, test_x = rng.normal(size=(300, 6)), rng.normal(size=(50, 6))
  train_y = rng.integers(0, 5, 300)
  unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)
  want = []
  for x in unit(test_x):
    sim = unit(train_x) @ x
    top = np.argsort(-sim)[:20]
    want.append(np.argmax(np.bincount(train_y[top], np.exp(sim[top] / 0.1), minlength=5)))
  got = evaluation.knn_classify(train_x, train_y, test_x, 5, k=20, temperature=0.1, batch_size=16)
  assert got.tolist() == want


def test_linear_classifier_separates_separable_features():
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(4, 8)) * 4
  y = np.repeat(np.arange(4), 50)
  x = centers[y] + rng.normal(size=(200, 8))
  acc = evaluation.train_linear_classifier(x[::2], y[::2], x[1::2], y[1::2], 4,
                                           LinearProbeConfig(steps=200, batch_size=50))
  assert acc >= 0.95


@pytest.mark.parametrize("optimizer", ["lars", "adam"])
def test_a_fit_reusing_a_traced_classifier_equals_a_fit_from_scratch(optimizer):
  """The probe's classifier and optimizer are traced once per shape and reset for each fit: a fit
  after another fit (other data, its momentum and step count left behind) gives the very weights
  of a fit on a fresh classifier, and a run of them the very accuracies."""
  from tff_ssl.evaluation import protocols  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  y = np.repeat(np.arange(3), 20)
  fits = [(rng.normal(size=(60, 5)) + 2 * np.eye(3, 5)[y], y) for _ in range(2)]
  config = LinearProbeConfig(steps=7, batch_size=16, optimizer=optimizer, learning_rate=0.5)

  def fit(x, labels):
    acc = evaluation.train_linear_classifier(x, labels, x, labels, 3, config)
    trainer = protocols._trainers[(5, 3, optimizer, 0.5, 7)]  # pylint: disable=protected-access
    return acc, [w.numpy().copy() for w in trainer.weights]

  protocols._trainers.clear()  # pylint: disable=protected-access
  scratch = fit(*fits[1])
  protocols._trainers.clear()  # pylint: disable=protected-access
  fit(*fits[0])
  # Between fits, a TFF trace builds a Keras Dense in a TF1 graph (as a federated round's heads do),
  # which turns Keras' Dense class into its TF1 version: the kept classifier must not mind.
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.tensorflow.computation(tff.TensorType(np.float32, [None, 5]))
  def dense(x):
    return tf.keras.layers.Dense(2)(x)

  del dense
  again = fit(*fits[1])
  assert again[0] == scratch[0]
  for a, b in zip(again[1], scratch[1]):
    np.testing.assert_array_equal(a, b)
  assert np.abs(scratch[1][0]).max() > 0  # It trained.


def test_linear_probe_on_pixels_of_synthetic_images(synthetic_train, synthetic_test):
  config = LinearProbeConfig(label_fraction=0.5, steps=200, batch_size=100)
  acc = evaluation.linear_probe(evaluation.raw_pixels((28, 28, 1)), synthetic_train, synthetic_test,
                                config)
  assert acc > 0.2  # Chance is 0.1; gratings at random phase are not linearly separable in pixels.
  # The raw-pixel baseline is exactly a classifier on the standardized [0, 1] pixels.
  idx = evaluation.labeled_subset(synthetic_train.labels, 0.5, 0)
  x = synthetic_train.images[idx].reshape(len(idx), -1).astype(np.float32) / 255
  t = synthetic_test.images.reshape(len(synthetic_test.images), -1).astype(np.float32) / 255
  mean, std = x.mean(0), x.std(0) + 1e-6
  # The same classifier on features computed in NumPy, not in the probe's TensorFlow graph: the
  # features agree to round-off, so at most one of the 200 test predictions may flip (0 in
  # the four oneDNN set-ups of BUILD-notes, "Numbers across CPUs").
  numpy_acc = evaluation.train_linear_classifier(
      (x - mean) / std, synthetic_train.labels[idx], (t - mean) / std, synthetic_test.labels, 10,
      config)
  spread.within("raw-pixel probe, TF features vs NumPy features", abs(acc - numpy_acc),
                1 / len(synthetic_test.images))


def test_fine_tune_learns_and_leaves_the_original_encoder_untouched(synthetic_train,
                                                                     synthetic_test):
  tf.keras.utils.set_random_seed(0)
  enc = models.build_encoder("resnet14", (28, 28, 1), width=0.5)
  before = [w.copy() for w in enc.get_weights()]
  acc = evaluation.fine_tune(enc, synthetic_train, synthetic_test,
                             FineTuneConfig(label_fraction=0.5, steps=30, batch_size=64,
                                            learning_rate=3e-3))
  assert acc > 0.3
  for a, b in zip(before, enc.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_supervised_from_scratch_beats_chance(synthetic_train, synthetic_test):
  acc = evaluation.supervised_from_scratch(
      lambda: models.build_encoder("resnet14", (28, 28, 1), width=0.5), synthetic_train,
      synthetic_test, FineTuneConfig(label_fraction=0.5, steps=30, batch_size=64,
                                     learning_rate=3e-3))
  assert acc > 0.3


def test_extract_features_batches_consistently(synthetic_test):
  tf.keras.utils.set_random_seed(0)
  enc = models.build_encoder("resnet14", (28, 28, 1), width=0.5)
  a = evaluation.extract_features(enc, synthetic_test.images[:10], batch_size=3)
  b = evaluation.extract_features(enc, synthetic_test.images[:10], batch_size=10)
  np.testing.assert_allclose(a, b, atol=1e-5)


def test_features_of_many_encoders_print_no_retracing_warning(caplog):
  # One cached forward pass per encoder: seven encoders are seven functions, not seven retraces.
  images = np.zeros((3, 8, 8, 1), np.uint8)
  with caplog.at_level("WARNING", logger="tensorflow"):
    for _ in range(7):
      encoder = tf.keras.Sequential([tf.keras.Input((8, 8, 1)), tf.keras.layers.Flatten()])
      assert evaluation.extract_features(encoder, images).shape == (3, 64)
  assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def _softmax_objective_gradient(x, y, w, b, l2):
  """d/d(W, b) of mean cross-entropy + l2/2·||W||², in NumPy."""
  logits = x @ w + b
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(y.size), y] -= 1
  return x.T @ p / y.size + l2 * w, p.mean(0)


@pytest.mark.parametrize("l2", [1e-3, 1e-1])
def test_tuned_probe_minimizes_the_stated_objective(l2):
  """The classifier refit with the chosen strength is the minimizer of mean cross-entropy +
  λ/2·||W||² (its gradient, computed independently, vanishes): the λ of the grid is what is fit."""
  rng = np.random.default_rng(1)
  y = np.repeat(np.arange(3), 40)
  x = rng.normal(size=(3, 5))[y] + rng.normal(size=(120, 5))
  config = evaluation.TunedLinearProbeConfig(l2_grid=(l2,), max_iterations=5000)
  chosen, scores, model = evaluation.tune_linear_classifier(x, y, config)
  assert chosen == l2 and set(scores) == {l2}
  gw, gb = _softmax_objective_gradient(x, y, model.coef_.T, model.intercept_, l2)
  assert np.abs(gw).max() < 1e-4 and np.abs(gb).max() < 1e-4
  # Another λ's minimizer is not this one's.
  gw, _ = _softmax_objective_gradient(x, y, model.coef_.T, model.intercept_, 3 * l2)
  assert np.abs(gw).max() > 1e-3


def test_tuned_probe_chooses_by_held_out_accuracy_ties_to_the_strongest():
  rng = np.random.default_rng(0)
  y = np.repeat(np.arange(4), 50)
  x = rng.normal(size=(4, 8))[y] * 10 + rng.normal(size=(200, 8))  # Separable: every λ scores 1.
  grid = (1e-4, 1e-2, 1e-1)
  chosen, scores, _ = evaluation.tune_linear_classifier(
      x, y, evaluation.TunedLinearProbeConfig(l2_grid=grid))
  assert scores == {l2: 1.0 for l2 in grid} and chosen == 1e-1
  # Chance-level labels: the candidates' held-out scores differ, and the best one is chosen.
  y = rng.permutation(y)
  chosen, scores, _ = evaluation.tune_linear_classifier(
      x, y, evaluation.TunedLinearProbeConfig(l2_grid=grid))
  assert len(set(scores.values())) > 1 and scores[chosen] == max(scores.values())


def test_tuned_probe_chooses_without_the_test_split(synthetic_train, synthetic_test):
  """The choice (and each candidate's held-out score) is the same whatever the test split holds; only
  the reported accuracy moves with it."""
  config = evaluation.TunedLinearProbeConfig(label_fraction=0.5, l2_grid=(1e-4, 1e-2, 1.0))
  pixels = evaluation.raw_pixels((28, 28, 1))
  fit = evaluation.tuned_linear_probe_fit(pixels, synthetic_train, synthetic_test, config)
  rng = np.random.default_rng(0)
  shuffled = synthetic_test.subset(rng.permutation(len(synthetic_test))[:50])
  other = dataclasses.replace(shuffled, labels=rng.permutation(shuffled.labels))
  refit = evaluation.tuned_linear_probe_fit(pixels, synthetic_train, other, config)
  assert (refit.l2, refit.holdout_accuracy) == (fit.l2, fit.holdout_accuracy)
  assert fit.test_accuracy > 0.2 and refit.test_accuracy != fit.test_accuracy
  assert evaluation.evaluate(pixels, synthetic_train, synthetic_test, config) == fit.test_accuracy


@pytest.mark.parametrize("field,value,message", [
    ("l2_grid", (), "l2_grid must hold L2 strengths > 0"),
    ("l2_grid", (0.1, 0.0), "l2_grid must hold L2 strengths > 0"),
    ("holdout_fraction", 1.0, "holdout_fraction must be in (0, 1)"),
    ("label_fraction", 0.0, "label fraction must be in (0, 1]"),
    ("max_iterations", 0, "max_iterations must be >= 1")])
def test_tuned_probe_refuses_bad_settings(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    evaluation.TunedLinearProbeConfig(**{field: value})
