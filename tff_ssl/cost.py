"""What a client pays, measured rather than estimated: bytes of a TFF value from its type, and the
floating-point operations of a TensorFlow function from its graph.

  message_bytes(type)     the size of a (nested) TFF type's tensors: what a computation whose
                          parameter or result has that type sends (e.g. the broadcast model, the
                          upload); unknown dimensions are an error, not a guess
  graph_flops(fn, specs)  TF's registered count (its profiler's) of the float operations in `fn`'s graph for inputs of
                          `specs` (the ops its outputs depend on): 2 M N K for a matmul, per-element
                          ops counted once (TF's conventions); the ops TF registers no count for are
                          listed, not assumed free
  peak_memory(fn, args)   the resident memory a call of `fn` adds at its peak, measured by the kernel
                          (VmHWM after resetting it), with large allocations given back on free

TF registers no count for `Einsum` (Keras' attention layers and `EinsumDense` are einsums); it is
registered here from the graph's own shapes: 2 x (the product of every index's size) when an index is
summed over, the product alone otherwise (the convention of TF's MatMul count).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow.python.framework import graph_util, ops  # pylint: disable=no-name-in-module

from tff_ssl.federated import client_work, common
from tff_ssl.models import vit


def message_bytes(value_type) -> int:
  """Bytes of all the tensors in a TFF type (a `tff.Type`, or what `tff.types.to_type` takes);
  placement is ignored (the value at one client or at the server)."""
  value_type = tff.types.to_type(value_type)
  total = 0
  for t in tff.structure.flatten(_unplaced(value_type)):
    if not isinstance(t, tff.TensorType):
      raise TypeError(f"message_bytes counts tensors; got {t}")
    shape = list(t.shape) if t.shape is not None else None
    if shape is None or any(d is None for d in shape):
      raise ValueError(f"a tensor of unknown shape {t.shape} has no fixed size; count a concrete "
                       f"type")
    total += int(np.prod(shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
  return total


# The intrinsics that move CLIENTS values to the SERVER (their first argument: what clients send).
UPLOAD_INTRINSICS = ("federated_sum", "federated_mean", "federated_weighted_mean",
                     "federated_aggregate", "federated_secure_sum", "federated_secure_sum_bitwidth",
                     "federated_secure_modular_sum", "federated_max", "federated_min")


def upload_bytes(computation) -> dict[str, int]:
  """Bytes each client sends in one call of a federated `computation`, per intrinsic (summed over
  its calls) and in total (`total`), read from the computation's types: the CLIENTS-placed
  argument of every aggregation intrinsic it calls (an encoded sum's packed integers, a secure
  sum's quantized integers, a plain sum's floats)."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.compiler import building_blocks
  # pylint: enable=g-import-not-at-top
  out: dict[str, int] = {}

  def visit(bb):
    if (isinstance(bb, building_blocks.Call) and isinstance(bb.function, building_blocks.Intrinsic)
        and bb.function.uri in UPLOAD_INTRINSICS):
      arg = bb.argument.type_signature
      value = arg[0] if isinstance(arg, tff.StructType) else arg
      size = message_bytes(value)
      out[bb.function.uri] = out.get(bb.function.uri, 0) + size
    for child in bb.children():
      visit(child)

  visit(computation.to_building_block())
  out["total"] = sum(out.values())
  return out


def _unplaced(value_type):
  if isinstance(value_type, tff.FederatedType):
    return value_type.member
  if isinstance(value_type, tff.StructType):
    return tff.StructType([(name, _unplaced(t)) for name, t in tff.structure.iter_elements(
        value_type)])
  return value_type


@ops.RegisterStatistics("Einsum", "flops")
def _einsum_flops(graph, node):
  equation = node.attr["equation"].s.decode()
  inputs, output = equation.replace(" ", "").split("->")
  operands = inputs.split(",")
  if "." in equation:
    raise ValueError(f"einsum {equation!r}: ellipses are not counted")
  sizes = {}
  for spec, name in zip(operands, node.input):
    shape = graph_util.tensor_shape_from_node_def_name(graph, name)
    shape.assert_is_fully_defined()
    for letter, size in zip(spec, shape.as_list()):
      sizes[letter] = size
  product = int(np.prod(list(sizes.values()), dtype=np.int64))
  summed = set("".join(operands)) - set(output)
  return ops.OpStats("flops", (2 if summed else 1) * product)


def graph_flops(fn: Callable, specs: Sequence[tf.TensorSpec]) -> tuple[int, list[str]]:
  """(float operations of one call of `fn` on inputs of `specs`, the op types in its graph that TF
  counts nothing for). Nested function calls and loops are not descended into: trace one step."""
  graph = tf.function(fn).get_concrete_function(*specs).graph
  # Only the ops the outputs depend on (e.g. not the heads of a model run for its features alone),
  # each counted by its registered statistic, as TF's profiler counts them.
  needed, todo = set(), [t.op for t in graph.outputs]
  while todo:
    op = todo.pop()
    if op.name not in needed:
      needed.add(op.name)
      todo.extend(t.op for t in op.inputs)
      todo.extend(op.control_inputs)
  counted = [op for op in graph.get_operations() if op.name in needed]
  total = sum(int(ops.get_stats_for_node_def(graph, op.node_def, "flops").value or 0)
              for op in counted)
  uncounted = sorted({op.type for op in counted
                      if op.type in _ELEMENTWISE_MATH and not _counted(op.type)})
  return total, uncounted


def _counted(op_type: str) -> bool:
  try:
    ops._stats_registry.lookup(f"{op_type},flops")  # pylint: disable=protected-access
    return True
  except LookupError:
    return False


# Elementwise math that a count may lack (TF 2.14 registers none for Erf, Tanh, Exp, Sqrt, Sigmoid,
# Relu, Gelu, Max, LogSoftmax, the softmax cross-entropy, ReluGrad, Select, Abs): `graph_flops` names
# the ones in a graph, so a total is never silently low. They cost O(elements), against the O(elements
# x width) of the matmuls and convolutions that dominate.
_ELEMENTWISE_MATH = ("Erf", "Tanh", "Exp", "Log", "Sqrt", "Rsqrt", "Square", "Pow", "Softplus",
                     "Sigmoid", "Relu", "Gelu", "Max", "LogSoftmax", "Softmax",
                     "SparseSoftmaxCrossEntropyWithLogits", "ReluGrad", "Select", "SelectV2", "Abs")


MMAP_THRESHOLD = 65536  # Bytes: `peak_memory` needs MALLOC_MMAP_THRESHOLD_ at most this.
# The environment `peak_memory` needs, set before Python starts (`bin/benchmark` restarts itself).
MEASURING_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "TF_ENABLE_ONEDNN_OPTS": "0"}


def _status_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise OSError(f"/proc/self/status has no {field}")


def peak_memory(fn: Callable, *args, repeats: int = 3) -> int:
  """Bytes of resident memory a call `fn(*args)` adds at its peak: the kernel's high-water mark
  (VmHWM), reset just before the call (/proc/self/clear_refs), minus the resident memory then; the
  smallest of `repeats` calls after a first one (which traces and warms up).

  Freed memory must go back to the kernel, or a second call reuses it unseen. Two settings of the
  environment, made before Python starts (`MEASURING_ENV`), do that: TF_ENABLE_ONEDNN_OPTS=0, as
  oneDNN's CPU allocator keeps a pool it never returns (measured: a call holding 16 MB of tensors
  shows 0 bytes with it on), so TF's tensors come from glibc's malloc; and MALLOC_MMAP_THRESHOLD_,
  which makes glibc serve every allocation of at least that size (TF's tensors of a local step are
  larger) by mmap, given back on free. Without them this raises; `bin/benchmark` sets them. The
  kernels measured are then TF's own (Eigen), not oneDNN's."""
  threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_")
  if (threshold is None or int(threshold) > MMAP_THRESHOLD or
      os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0"):
    raise RuntimeError(f"peak_memory needs freed tensors given back to the kernel: start Python with "
                       f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} TF_ENABLE_ONEDNN_OPTS=0 in its "
                       f"environment (got {threshold}, "
                       f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS')})")
  fn(*args)
  peaks = []
  for _ in range(repeats):
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")  # Resets VmHWM to the current resident set.
    before = _status_kb("VmRSS")
    out = fn(*args)
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
    peaks.append(_status_kb("VmHWM") - before)
  return 1024 * min(peaks)


def local_step(model, mask, fedavg_config, images: np.ndarray, keep=None):
  """(One local step of a client on `images` as a function of (weights, images, ids): the SSL loss
  with the method's client terms (`client_work.client_loss`: LW-FedSSL's alignment) and its gradient
  with respect to the tensors of `mask`; its input specs). `keep`: a ViT block-keep pattern (tuple of
  bools, `models.vit.block_keep`) the forward passes run under (FLL's depth dropout)."""
  method = fedavg_config.method
  n = len(images)
  seed = common.round_seed(fedavg_config.seed, 0)

  def step(weights, images, ids):
    trained = mask.select(list(weights))
    v1, v2 = common.views({"images": images, "ids": ids}, seed, fedavg_config.augment)
    with vit.block_keep(keep), tf.GradientTape() as tape:
      tape.watch(trained)
      current = mask.merge(trained, list(weights))
      outputs = client_work.view_outputs(
          model, method, current, None, v1, v2,
          client_work.initial_ssl_state(model, fedavg_config).get("queue"),
          fedavg_config.predictions)
      loss = client_work.client_loss(fedavg_config, client_work.Step(
          model, outputs, list(weights), current, v1, v2, {"images": images, "ids": ids}, seed,
          fedavg_config.augment))
    return loss, tape.gradient(loss, trained)

  specs = ([tf.TensorSpec(s.shape, s.dtype) for s in model.weight_specs],
           tf.TensorSpec(images.shape, tf.uint8), tf.TensorSpec([n], tf.int64))
  return step, specs


def local_step_cost(model, mask, fedavg_config, images: np.ndarray, *, keep=None,
                    memory: bool = False, flops: bool = True) -> dict:
  """What one client pays for one local step of FedAvg-style SSL training of `model`'s tensors in
  `mask` on `images` ([N, H, W, C] uint8): the bytes it downloads (the process's broadcast type: every
  tensor of the model), the bytes of the trained tensors (what a client that kept the frozen ones
  needs), the bytes it uploads (its upload type: the trained tensors' Delta), the float operations
  of the step (with `flops`; `local_step`: two views through the model, the loss, the gradient of
  the trained tensors; from the graph) and, with `memory`, the step's measured peak memory above the model's
  weights (`peak_memory`)."""
  step, specs = local_step(model, mask, fedavg_config, images, keep)
  trained = message_bytes(common.tensors_type(mask.select(model.weight_specs)))
  out = {"download_bytes": message_bytes(common.weights_type(model)),
         "trained_bytes": trained, "upload_bytes": trained}
  if flops:
    out["step_flops"], out["uncounted_ops"] = graph_flops(step, specs)
  if memory:
    compiled = tf.function(step).get_concrete_function(*specs)
    weights = [tf.constant(w) for w in model.initial_weights]
    out["step_peak_bytes"] = peak_memory(
        compiled, weights, tf.constant(images), tf.constant(np.arange(len(images), dtype=np.int64)))
  return out
