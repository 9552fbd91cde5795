"""A Keras model as a pure function of a flat list of weight tensors, for use inside TFF computations.

TFF computations pass model weights as values, not variables. `FunctionalModel` rebuilds the Keras model
under a `tf.variable_creator_scope` that hands out the given tensors in place of new variables (the
mechanism of `tff.learning.models.functional_model_from_keras`, which we do not use directly because it
forces a supervised `loss(output, label)` interface and a (trainable, non_trainable) split that SSL
models with two heads and no labels do not have). Gradients are taken with respect to the weight tensors.
Use inside a `tf.function` or `tff.tensorflow.computation`. The model is built from tensors once per
graph mode (TF1 graphs, as TFF traces, or TF2); later calls hand its layers their tensors in place.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf


# What `FunctionalModel.keras_model` lent, and the parts of it lent on (`lend_part`): each -> (its
# FunctionalModel, the lent model), both weakly: a model no one releases is simply not reused.
_LENT: "weakref.WeakKeyDictionary[tf.keras.layers.Layer, tuple]" = weakref.WeakKeyDictionary()


def lend_part(part: tf.keras.layers.Layer, model: tf.keras.Model) -> tf.keras.layers.Layer:
  """`part` (a layer of `model`, which `FunctionalModel.keras_model` lent), releasable as `model`."""
  if model in _LENT:
    _LENT[part] = _LENT[model]
    # The part keeps its model alive (nothing else need hold it): a plain attribute, which Keras does
    # not track.
    object.__setattr__(part, "_lent_with", model)
  return part


def release(*lent: tf.keras.layers.Layer) -> None:
  """Gives models that `FunctionalModel.keras_model` lent (or parts lent with `lend_part`, e.g. an
  encoder) back to their FunctionalModel for reuse: their holder must not use them again. Anything
  else (a centralized run's encoder) is left alone."""
  for x in lent:
    owner, model = (ref() for ref in _LENT.get(x, (lambda: None, lambda: None)))
    if owner is not None and model is not None:
      owner.release(model)


def _is_keras_counter(kwargs) -> bool:
  """Keras' Model creates train/test/predict step counters: unnamed, replica-aggregated scalars."""
  return (kwargs.get("name") is None and kwargs.get("trainable") is None and
          kwargs.get("aggregation") == tf.VariableAggregation.ONLY_FIRST_REPLICA)


_NORMALIZATION_LAYERS = (tf.keras.layers.GroupNormalization, tf.keras.layers.LayerNormalization,
                         tf.keras.layers.BatchNormalization)


def _owning_layers(model: tf.keras.Model) -> dict[int, tuple[str, bool]]:
  """id(variable) -> (path of the innermost Keras layer that owns it, is a normalization layer)."""
  owners: dict[int, tuple[str, bool]] = {}

  def visit(layer, prefix):
    path = f"{prefix}{layer.name}"
    if isinstance(layer, tf.keras.Model):
      for sub in layer.layers:
        visit(sub, "" if layer is model else f"{path}/")
      return
    if getattr(layer, "flatten_weight_paths", False):
      # A container layer whose sublayers name its weights as if they were the parent's own
      # layers (the ViT's `Block`: "encoder/block3_attn/query/kernel").
      for sub in layer._flatten_layers(include_self=False, recursive=False):  # pylint: disable=protected-access
        visit(sub, prefix)
      return
    for v in layer.weights:  # Leaf layers own their weights.
      owners.setdefault(id(v), (path, isinstance(layer, _NORMALIZATION_LAYERS)
                                or getattr(layer, "normalizes", False)))

  visit(model, "")
  return owners


def _weight_path(layer_path: str, variable_name: str) -> str:
  """The full path of a weight: its owning layer's path in the model + the weight's path inside that
  layer ("encoder/mha/query/kernel": an attention layer's query kernel, not its other kernels).

  Keras names a variable `<layer name>/<path inside the layer>:0`, sometimes under outer name scopes;
  the path inside the layer is what follows the layer's own name (the last part if it is not there).
  """
  parts = variable_name.split(":")[0].split("/")
  leaf = layer_path.split("/")[-1]
  inside = parts[parts.index(leaf) + 1:] if leaf in parts[:-1] else parts[-1:]
  return "/".join([layer_path] + inside)


def weight_paths(model: tf.keras.Model) -> dict[str, tf.Variable]:
  """path -> weight of a Keras model, by the paths `FunctionalModel.names` gives its weights when
  the model is a part of another named `model.name` (less that prefix)."""
  owners = _owning_layers(model)
  return {_weight_path(owners[id(v)][0], v.name): v for v in model.weights}


def with_encoder(model: "FunctionalModel", encoder: dict[str, np.ndarray], prefix: str,
                 source: str) -> list[np.ndarray]:
  """`model`'s initial weights with those under `prefix` ("encoder/") taken from `encoder` (path ->
  value, `weight_paths`); a one-line ValueError naming `source` where the two encoders differ."""
  ours = {n[len(prefix):]: i for i, n in enumerate(model.names) if n.startswith(prefix)}
  for path in sorted(set(ours) | set(encoder)):
    if path not in ours or path not in encoder:
      where = "this run's" if path in ours else source
      raise ValueError(f"--init_from={source}: only {where} encoder has the weight {prefix}{path}; "
                       f"pretrain the source with this run's --encoder, --width, --stem_stride and "
                       f"--pool_grid")
    if tuple(np.shape(encoder[path])) != tuple(model.initial_weights[ours[path]].shape):
      raise ValueError(f"--init_from={source}: its {prefix}{path} has shape "
                       f"{tuple(np.shape(encoder[path]))}, this run's "
                       f"{tuple(model.initial_weights[ours[path]].shape)}; pretrain the source "
                       f"with this run's encoder settings and image shape")
  weights = [w.copy() for w in model.initial_weights]
  for path, i in ours.items():
    weights[i] = np.asarray(encoder[path], dtype=weights[i].dtype).copy()
  return weights


def _keras_classes(model: tf.keras.Model, v2: bool = True) -> None:
  """Keras 2 picks a layer's base class (TF2 or TF1 Layer/Model) when the layer is constructed, by
  changing its class's `__bases__`: building a model in a TF1 graph (as TFF traces its computations)
  turns every class it uses into the TF1 one, and a model built earlier in eager mode can no longer
  be called ("Your Layer or Model is in an invalid state"), nor a model built in a TF1 graph after
  an eager one was built. This turns the classes of `model`'s layers to the TF2 (`v2`) or TF1 ones,
  as constructing it again in that mode would."""
  # pylint: disable=g-import-not-at-top
  from keras.src.engine import base_layer, base_layer_v1, training, training_v1
  from keras.src.utils import version_utils
  # pylint: enable=g-import-not-at-top
  for layer in model._flatten_layers(include_self=True, recursive=True):  # pylint: disable=protected-access
    cls = type(layer)
    if issubclass(cls, (training.Model, training_v1.Model)):
      version_utils.swap_class(cls, training.Model, training_v1.Model, v2)
    version_utils.swap_class(cls, base_layer.Layer, base_layer_v1.Layer, v2)


class FunctionalModel:
  """`model(weights, x, training)` for a Keras model built by `build_fn`."""

  def __init__(self, build_fn: Callable[[], tf.keras.Model]):
    """
    Args:
      build_fn: builds the Keras model (the same architecture on every call). It is called once here
        to record the weights' order, shapes and initial values; initialization draws from TF's global
        seed, so seed first (`tf.keras.utils.set_random_seed`).
    """
    self._build_fn = build_fn
    created = []  # In creation order, which is the order __call__ hands tensors out in.

    def record(next_creator, **kwargs):
      v = next_creator(**kwargs)
      created.append(v)
      return v

    with tf.variable_creator_scope(record):
      model = build_fn()
    # A frozen layer's weights (trainable=False: the ViT's frozen patch projection) are the model's
    # weights like any other, which no trainer changes (`frozen`); any other non-trainable variable
    # (BatchNorm's moving statistics) is state a pure function of the weights cannot keep.
    frozen_ids = {id(v) for layer in model._flatten_layers(include_self=False, recursive=True)  # pylint: disable=protected-access
                  if not layer.trainable and not isinstance(layer, _NORMALIZATION_LAYERS)
                  and not list(layer._flatten_layers(include_self=False, recursive=False))  # pylint: disable=protected-access
                  for v in layer.weights}
    stateful = [v for v in model.non_trainable_variables if id(v) not in frozen_ids]
    if stateful:
      raise ValueError(f"{model.name} has non-trainable variables "
                       f"({[v.name for v in stateful][:3]}); federated models "
                       f"must be batch-independent (GroupNorm, not BatchNorm)")
    # Keras models also create step counters (not weights); keep the model's own variables only.
    in_model = {id(v) for v in model.variables}
    created = [v for v in created if id(v) in in_model]
    if len(created) != len(model.variables):
      raise ValueError(f"{model.name} holds variables it did not create; shared variables are not "
                       f"supported")
    self.initial_weights: list[np.ndarray] = [v.numpy() for v in created]
    self.weight_specs = [tf.TensorSpec(v.shape, v.dtype) for v in created]
    owners = _owning_layers(model)
    # Per weight tensor: its Keras layer's path ("encoder/stage1_block1_conv1"), whether that layer
    # normalizes (GroupNorm), and the tensor's full path ("encoder/stage1_block1_conv1/kernel",
    # "encoder/block1_attention/query/kernel"): what masks, LARS and layer-wise strategies select by.
    self.layer_names = [owners[id(v)][0] for v in created]
    self.normalization = [owners[id(v)][1] for v in created]
    self.names = [_weight_path(owners[id(v)][0], v.name) for v in created]
    self.frozen = [id(v) in frozen_ids for v in created]
    if len(set(self.names)) != len(self.names):
      dup = sorted({n for n in self.names if self.names.count(n) > 1})
      raise ValueError(f"{model.name} has several weight tensors at the path {dup[0]!r}; give its "
                       f"layers unique names")
    outputs = model.output_shape if isinstance(model.output_shape, list) else [model.output_shape]
    self.output_dims = [int(shape[-1]) for shape in outputs]
    self.output_dim = self.output_dims[0]
    # Keras models of this architecture (with their variables in this model's order) that no one
    # holds: `keras_model` lends one out and `release` takes it back, so a run builds its first one
    # here and reuses it for every probe (building one cost 0.4-1.7 s for the suite's ResNets).
    self._pool: list[tuple[tf.keras.Model, list[tf.Variable]]] = [(model, created)]
    self._variables: "weakref.WeakKeyDictionary[tf.keras.Model, list]" = weakref.WeakKeyDictionary()
    # {TF1 graph mode?: (a model built from tensors, where it holds them)}: `__call__` builds the
    # model once per mode and then hands the layers each call's tensors (`_WeightSlot`); building
    # it (Keras' functional construction traces every layer once more) cost ResNet-18 1.2 s a call.
    self._bound: dict = {}
    self._lock = threading.RLock()

  def keras_model(self, weights: Sequence[np.ndarray]) -> tf.keras.Model:
    """A Keras model of this architecture whose variables start at `weights` (this model's order):
    e.g. the encoder of a checkpoint, for evaluation."""
    if len(weights) != len(self.weight_specs):
      raise ValueError(f"expected {len(self.weight_specs)} weight tensors; got {len(weights)}")
    with self._lock:
      pooled = self._pool.pop() if self._pool else None
    if pooled is None:
      model, variables = self._build_variables(weights)
    else:
      model, variables = pooled
      _keras_classes(model)
      for variable, value in zip(variables, weights):
        variable.assign(value)
    self._variables[model] = variables
    _LENT[model] = (weakref.ref(self), weakref.ref(model))
    return model

  def release(self, model: tf.keras.Model) -> None:
    """Takes back a model `keras_model` lent, for its next call to reuse (its variables get that
    call's weights): the caller and whatever it gave the model to must not use it again."""
    with self._lock:
      variables = self._variables.get(model)
      if variables is not None and not any(m is model for m, _ in self._pool):
        self._pool.append((model, variables))

  def _build_variables(self, weights: Sequence[np.ndarray]
                       ) -> tuple[tf.keras.Model, list[tf.Variable]]:
    queue, variables = list(weights), []

    def init_from_weights(next_creator, **kwargs):
      counter = _is_keras_counter(kwargs)
      if not counter:
        kwargs["initial_value"] = queue.pop(0)
      v = next_creator(**kwargs)
      if not counter:
        variables.append(v)
      return v

    with tf.variable_creator_scope(init_from_weights):
      return self._build_fn(), variables

  def __call__(self, weights: Sequence[tf.Tensor], x: tf.Tensor, training: bool = True):
    if len(weights) != len(self.weight_specs):
      raise ValueError(f"expected {len(self.weight_specs)} weight tensors; got {len(weights)}")
    # Keras 2 builds TF1 layers in TFF's (TF1) graphs and TF2 layers elsewhere: one model per kind.
    mode = tf.compat.v1.executing_eagerly_outside_functions()
    with self._lock:
      reused = self._bound.get(mode)
      if reused is not None:
        model, slots = reused
        _keras_classes(model, v2=mode)  # A model built since may have turned them.
        for slot, tensor in zip(slots, weights):
          slot.bind(tensor)
        try:
          return model(x, training=training)
        finally:  # The layers hold no tensor of this graph once the call has returned.
          for slot in slots:
            slot.bind(None)
    queue = list(weights)

    def use_given_tensor(next_creator, **kwargs):  # pylint: disable=unused-argument
      if _is_keras_counter(kwargs):
        value = kwargs["initial_value"]
        return tf.convert_to_tensor(value() if callable(value) else value)
      return queue.pop(0)

    with tf.variable_creator_scope(use_given_tensor):
      model = self._build_fn()
    if queue:
      raise ValueError(f"{len(queue)} weight tensors were not used by the model")
    out = model(x, training=training)
    slots = _WeightSlot.find(model, weights)
    if slots is not None:
      with self._lock:
        for slot in slots:
          slot.bind(None)
        self._bound[mode] = (model, slots)
    return out


class _WeightSlot:
  """Where a model built from given tensors holds one of them: the attributes of its layers that are
  that tensor (`layer.kernel`) and its place in the layers' weight lists. `bind` puts another tensor
  there, so that the model computes with it (the same layer code, op for op, as a model built from
  it)."""

  def __init__(self):
    self.attributes: list[tuple[object, str]] = []
    self.lists: list[tuple[list, int]] = []

  def bind(self, tensor) -> None:
    for layer, name in self.attributes:
      object.__setattr__(layer, name, tensor)
    for weights, i in self.lists:
      weights[i] = tensor

  @classmethod
  def find(cls, model: tf.keras.Model, weights: Sequence[tf.Tensor]) -> "list[_WeightSlot] | None":
    """Each weight's slot in `model` (built from `weights`); None where one of them is held
    anywhere else (a list or dict of the layer's own), which `bind` could not reach: such a model
    is built again at every call."""
    position = {id(w): i for i, w in enumerate(weights)}
    if len(position) != len(weights):
      return None
    slots = [cls() for _ in weights]
    found = [0] * len(weights)
    for layer in model._flatten_layers(include_self=True, recursive=True):  # pylint: disable=protected-access
      for name, value in vars(layer).items():
        if name == "_obj_reference_counts_dict":  # Keras' count of assignments, which call never reads.
          continue
        if name in ("_trainable_weights", "_non_trainable_weights"):
          for i, w in enumerate(value):
            if id(w) in position:
              slots[position[id(w)]].lists.append((value, i))
        elif id(value) in position:
          slots[position[id(value)]].attributes.append((layer, name))
          found[position[id(value)]] += 1
        elif isinstance(value, (list, tuple, dict)) or hasattr(value, "_storage"):
          items = value.values() if isinstance(value, dict) else value
          if any(id(v) in position for v in list(items)):
            return None
    if not all(found):
      return None
    return slots
