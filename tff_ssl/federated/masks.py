"""Which of a model's tensors a process trains and exchanges (`TensorMask`); the others are frozen:
never differentiated, uploaded, aggregated or stepped."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence


@dataclasses.dataclass(frozen=True)
class TensorMask:
  """Which of a model's tensors a process trains and exchanges (True), in the model's order.

  Frozen tensors (False) are still broadcast (clients need them for the forward pass) but are never
  differentiated, uploaded, aggregated or stepped: the upload and the aggregators' value type hold
  the trained tensors only, and the server optimizer's state covers only those.
  """

  trained: tuple[bool, ...]

  def __post_init__(self):
    object.__setattr__(self, "trained", tuple(bool(t) for t in self.trained))
    if not any(self.trained):
      raise ValueError("a tensor mask must train at least one tensor")

  @classmethod
  def all(cls, num_tensors: int) -> "TensorMask":
    return cls((True,) * num_tensors)

  @classmethod
  def of_model(cls, model) -> "TensorMask":
    """The mask training every tensor of `model` (a `FunctionalModel`) but its frozen ones
    (`FunctionalModel.frozen`: e.g. the ViT's frozen patch projection)."""
    return cls(tuple(not f for f in model.frozen))

  @classmethod
  def require_all(cls, model, method: str) -> "TensorMask":
    """The mask of every tensor of `model`, for a method that trains them all; ValueError where the
    model has frozen ones."""
    if any(model.frozen):
      frozen = [n for n, f in zip(model.names, model.frozen) if f]
      raise ValueError(f"{method} trains every tensor of the model; {frozen[0]!r} is frozen (drop "
                       f"--freeze_patch_embed)")
    return cls.all(len(model.frozen))

  @classmethod
  def from_names(cls, names: Sequence[str], trained: Callable[[str], bool]) -> "TensorMask":
    """The mask training the tensors whose name (`FunctionalModel.names`) satisfies `trained`."""
    mask = [bool(trained(n)) for n in names]
    if not any(mask):
      raise ValueError(f"no tensor of the model is selected for training (names like "
                       f"{list(names)[:3]})")
    return cls(tuple(mask))

  @property
  def indices(self) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(self.trained) if t)

  @property
  def full(self) -> bool:
    return all(self.trained)

  def check(self, num_tensors: int) -> None:
    if len(self.trained) != num_tensors:
      raise ValueError(f"the tensor mask covers {len(self.trained)} tensors; the model has "
                       f"{num_tensors}")

  def select(self, values: Sequence[Any]) -> list:
    """The trained entries of a model-ordered list."""
    return [values[i] for i in self.indices]

  def merge(self, trained: Sequence[Any], full: Sequence[Any]) -> list:
    """`full` with its trained entries replaced by `trained` (in order)."""
    out, it = list(full), iter(trained)
    for i in self.indices:
      out[i] = next(it)
    return out
