"""Image sources: uint8 images and integer labels per split, offline first.

`load(name, split)` returns an `ImageSet`. Sources (registry `SOURCES`):

  fashion_mnist  Debian's `dataset-fashion-mnist` IDX files (or $TFF_SSL_FASHION_MNIST_DIR); falls back
                 to tensorflow-datasets' `fashion_mnist` when those files are absent.
  cifar10, cifar100, stl10
                 tensorflow-datasets (stl10 has the extra split "unlabelled", labels -1). tfds is asked
                 not to download unless `download=True`: these machines are offline.
  fashion_mnist_shifted
                 Fashion-MNIST with every image, train and test, moved by a fixed offset of up to ±4
                 pixels in each direction, zero-filled (`shift_images`): a second testbed where objects
                 are not pixel-aligned, as in natural images, so raw pixels are a weaker baseline.
  synthetic      a small, seeded, class-structured image set made on the fly (for tests and smoke runs).

A source that cannot be had raises `DataUnavailableError` whose one-line message says how to get it.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
import struct
from typing import Callable

import numpy as np
from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
DATASET = Field("dataset", "fashion_mnist", "Image source.", choices=lambda: SOURCES)
DATA_DIR = Field("data_dir", None, "tensorflow-datasets folder for tfds sources.",
                 kind=str, optional=True)
DOWNLOAD = Field("download", False, "Let tfds download a missing dataset (needs the internet).")
PROBE_DATASET = Field(
    "probe_dataset", "", "Centralized runs: the labelled images the run's probes (and their raw-pixel "
    "and random-init baselines) read, '' for --dataset's; images of --dataset's shape, e.g. "
    "--dataset=synthetic_leaves --probe_dataset=fashion_mnist_shifted: an encoder pretrained on no "
    "task image, probed on the task.", choices=lambda: ("",) + tuple(SOURCES))


UNLABELED = -1
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
_FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


class DataUnavailableError(ValueError):
  """A data source's files are missing; the message says how to get them."""


@dataclasses.dataclass(frozen=True)
class ImageSet:
  """One split of an image dataset held in memory."""

  images: np.ndarray  # uint8 [N, H, W, C]
  labels: np.ndarray  # int64 [N]; UNLABELED (-1) where the split has no labels
  num_classes: int
  name: str = ""

  def __post_init__(self):
    if self.images.dtype != np.uint8 or self.images.ndim != 4:
      raise ValueError(f"images must be uint8 [N, H, W, C]; got {self.images.dtype} "
                       f"{self.images.shape}")
    if self.labels.shape != (self.images.shape[0],):
      raise ValueError(f"need one label per image; got {self.labels.shape[0]} labels for "
                       f"{self.images.shape[0]} images")

  def __len__(self) -> int:
    return self.images.shape[0]

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(self.images.shape[1:])

  def subset(self, indices: np.ndarray) -> "ImageSet":
    return ImageSet(self.images[indices], self.labels[indices], self.num_classes, self.name)


# ---------------------------------------------------------------------------------------------------
# Fashion-MNIST from IDX files.


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX file (optionally gzipped) of unsigned bytes into an array."""
  fix = ("reinstall it (apt-get install --reinstall dataset-fashion-mnist) or point "
         "TFF_SSL_FASHION_MNIST_DIR at intact files")
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      zero, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
      if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (header {zero}, "
                         f"{dtype_code}); {fix}")
      shape = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
      data = np.frombuffer(f.read(), dtype=np.uint8)
  except (EOFError, OSError, struct.error) as e:  # A truncated or corrupt (gzip) file.
    raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e}); {fix}") from None
  if data.size != int(np.prod(shape)):
    raise ValueError(f"{path} is truncated: {data.size} bytes for shape {shape}; {fix}")
  return data.reshape(shape)


def fashion_mnist_dir() -> str | None:
  """The folder holding the Fashion-MNIST IDX files, or None."""
  candidates = [os.environ["TFF_SSL_FASHION_MNIST_DIR"]] if os.environ.get(
      "TFF_SSL_FASHION_MNIST_DIR") else list(FASHION_MNIST_DIRS)
  for d in candidates:
    if all(os.path.exists(os.path.join(d, f)) for files in _FASHION_MNIST_FILES.values()
           for f in files):
      return d
  return None


def _load_fashion_mnist(split: str, data_dir: str | None, download: bool) -> ImageSet:
  _check_split("fashion_mnist", split, _FASHION_MNIST_FILES)
  d = fashion_mnist_dir()
  if d is None:
    try:
      return _load_tfds("fashion_mnist", split, data_dir, download, num_classes=10)
    except DataUnavailableError:
      raise DataUnavailableError(
          "Fashion-MNIST not found: install Debian's package (apt-get install dataset-fashion-mnist), "
          "set TFF_SSL_FASHION_MNIST_DIR to a folder with its four IDX .gz files, or prepare tfds "
          "'fashion_mnist'") from None
  image_file, label_file = _FASHION_MNIST_FILES[split]
  images = read_idx(os.path.join(d, image_file))[..., None]
  labels = read_idx(os.path.join(d, label_file)).astype(np.int64)
  return ImageSet(images, labels, 10, "fashion_mnist")


# The shifted testbed's offsets: a property of the data set, the same in every run, client and seed.
SHIFT_MAX_PIXELS = 4
SHIFT_SEED = 31  # Issue 31, which asked for the testbed.
_SPLIT_IDS = {"train": 0, "test": 1}


def shift_offsets(num_images: int, split: str, *, max_shift: int = SHIFT_MAX_PIXELS,
                  seed: int = SHIFT_SEED) -> np.ndarray:
  """int [N, 2]: the (rows, columns) offset of each image of `split`, each in [-max_shift,
  max_shift], drawn from (`seed`, the split) by the image's position in the split."""
  rng = np.random.default_rng([seed, _SPLIT_IDS[split]])
  return rng.integers(-max_shift, max_shift + 1, size=(num_images, 2))


def shift_images(images: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  """`images` [N, H, W, C] each moved by its `offsets` row (down and right for positive values),
  what leaves the frame dropped and what enters it zero."""
  out = np.zeros_like(images)
  h, w = images.shape[1:3]
  for dy, dx in np.unique(offsets, axis=0):
    idx = np.flatnonzero((offsets[:, 0] == dy) & (offsets[:, 1] == dx))
    src_y, dst_y = slice(max(0, -dy), h - max(0, dy)), slice(max(0, dy), h - max(0, -dy))
    src_x, dst_x = slice(max(0, -dx), w - max(0, dx)), slice(max(0, dx), w - max(0, -dx))
    out[idx, dst_y, dst_x] = images[idx, src_y, src_x]
  return out


def _load_fashion_mnist_shifted(split: str, data_dir: str | None, download: bool) -> ImageSet:
  base = _load_fashion_mnist(split, data_dir, download)
  moved = shift_images(base.images, shift_offsets(len(base), split))
  return ImageSet(moved, base.labels, base.num_classes, "fashion_mnist_shifted")


# ---------------------------------------------------------------------------------------------------
# tensorflow-datasets.

_TFDS_SPLITS = {
    "cifar10": ("train", "test"),
    "cifar100": ("train", "test"),
    "stl10": ("train", "test", "unlabelled"),
    "fashion_mnist": ("train", "test"),
}
_TFDS_CLASSES = {"cifar10": 10, "cifar100": 100, "stl10": 10, "fashion_mnist": 10}


def _load_tfds(name: str, split: str, data_dir: str | None, download: bool,
               num_classes: int | None = None) -> ImageSet:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  _check_split(name, split, _TFDS_SPLITS[name])
  try:
    ds = tfds.load(name, split=split, data_dir=data_dir, download=download)
  except AssertionError as e:  # tfds' way of saying "not prepared and download=False".
    raise DataUnavailableError(
        f"tfds dataset {name!r} is not prepared in {data_dir or '~/tensorflow_datasets'}: run "
        f"`tfds build {name}` on a machine with internet and copy the folder there, or pass "
        f"download=True (--download) where the internet can be reached") from e
  # Batched iteration rather than batch_size=-1, which needs the split's size up front.
  batches = list(tfds.as_numpy(ds.batch(4096)))
  images = np.concatenate([b["image"] for b in batches]).astype(np.uint8)
  labels = np.concatenate([b["label"] for b in batches]).astype(np.int64)
  if split == "unlabelled":
    labels = np.full(images.shape[0], UNLABELED, np.int64)
  labels = np.where(labels < 0, UNLABELED, labels)
  return ImageSet(images, labels, num_classes or _TFDS_CLASSES[name], name)


# ---------------------------------------------------------------------------------------------------
# Synthetic.


def synthetic(split: str = "train", *, num_examples: int | None = None, image_size: int = 28,
              channels: int = 1, num_classes: int = 10, seed: int = 0) -> ImageSet:
  """A class-structured synthetic image set: each class is an oriented grating plus noise.

  Deterministic in (split, seed); train and test use different noise.
  """
  _check_split("synthetic", split, ("train", "test"))
  n = num_examples if num_examples is not None else (2000 if split == "train" else 500)
  rng = np.random.default_rng([seed, 0 if split == "train" else 1])
  labels = np.arange(n, dtype=np.int64) % num_classes
  rng.shuffle(labels)
  yy, xx = np.mgrid[0:image_size, 0:image_size] / image_size
  angle = np.pi * labels / num_classes
  freq = 2.0 + (labels % 3)
  phase = rng.uniform(0, 2 * np.pi, size=n)
  wave = np.sin(2 * np.pi * freq[:, None, None] *
                (np.cos(angle)[:, None, None] * xx + np.sin(angle)[:, None, None] * yy) +
                phase[:, None, None])
  img = 0.5 + 0.35 * wave[..., None] + 0.1 * rng.standard_normal((n, image_size, image_size, channels))
  images = np.clip(np.round(img * 255), 0, 255).astype(np.uint8)
  return ImageSet(images, labels, num_classes, "synthetic")


# Procedural images that hold no image of any real dataset: pretraining that touches no private data
# (as ViP's synthetic Shaders21k pretraining does before its private training).

LEAF_SHAPES = ("disc", "square", "triangle", "bar")


@functools.lru_cache(maxsize=2)  # A run loads its splits more than once; generating takes seconds.
def dead_leaves(split: str = "train", *, num_examples: int | None = None, image_size: int = 28,
                leaves: int = 24, seed: int = 0) -> ImageSet:
  """Dead leaves (Matheron; Baradad et al. 2021 pretrain on them): each image a stack of `leaves`
  opaque shapes (disc, square, triangle, bar at a random angle) of random gray level, their sizes
  drawn from a power law (density ~ r^-3 between 1.5 and image_size / 2 pixels) at uniform random
  centers, painted back to front over a random gray background; grayscale, uint8. The label is the
  shape of the largest leaf, painted last (on top): a probe's task on the synthetic data itself.

  Deterministic in (split, seed); train (60,000 images) and test (10,000) from different streams.
  """
  _check_split("synthetic_leaves", split, ("train", "test"))
  n = num_examples if num_examples is not None else (60000 if split == "train" else 10000)
  rng = np.random.default_rng([seed, 0x1EAF, 0 if split == "train" else 1])
  r_min, r_max = 1.5, image_size / 2
  u = rng.random((n, leaves))  # Inverse CDF of a density ~ r^-3 on [r_min, r_max].
  radius = 1.0 / np.sqrt(r_min ** -2 - u * (r_min ** -2 - r_max ** -2))
  radius = np.sort(radius, axis=1)  # Small leaves first: the largest is painted last, on top.
  kind = rng.integers(0, len(LEAF_SHAPES), (n, leaves))
  center = rng.uniform(0, image_size, (n, leaves, 2))
  angle = rng.uniform(0, np.pi, (n, leaves))
  gray = rng.uniform(0, 1, (n, leaves))
  images = np.broadcast_to(rng.uniform(0, 1, (n, 1, 1)),
                           (n, image_size, image_size)).astype(np.float32)
  yy, xx = (np.mgrid[0:image_size, 0:image_size] + 0.5).astype(np.float32)
  for j in range(leaves):
    for k in range(len(LEAF_SHAPES)):  # Each shape's test on the images whose leaf j has it.
      ids = np.flatnonzero(kind[:, j] == k)
      dy = yy[None] - center[ids, j, 0, None, None].astype(np.float32)
      dx = xx[None] - center[ids, j, 1, None, None].astype(np.float32)
      c = np.cos(angle[ids, j])[:, None, None].astype(np.float32)
      s = np.sin(angle[ids, j])[:, None, None].astype(np.float32)
      u_, v_ = c * dx + s * dy, -s * dx + c * dy  # The leaf's own axes.
      r = radius[ids, j, None, None].astype(np.float32)
      if k == 0:
        inside = u_ ** 2 + v_ ** 2 <= r ** 2
      elif k == 1:
        inside = np.maximum(abs(u_), abs(v_)) <= r / np.sqrt(2)
      elif k == 2:
        inside = (v_ >= -r / 2) & (np.sqrt(3) * u_ + v_ <= r) & (-np.sqrt(3) * u_ + v_ <= r)
      else:
        inside = (abs(u_) <= r) & (abs(v_) <= r / 4)
      images[ids] = np.where(inside, gray[ids, j, None, None].astype(np.float32), images[ids])
  images = np.clip(np.round(images * 255), 0, 255).astype(np.uint8)[..., None]
  return ImageSet(images, kind[:, -1].astype(np.int64), len(LEAF_SHAPES), "synthetic_leaves")


# ---------------------------------------------------------------------------------------------------
# Registry.


def _check_split(name: str, split: str, valid) -> None:
  if split not in valid:
    raise ValueError(f"unknown split {split!r} for {name}; choose one of {sorted(valid)}")


SOURCES: dict[str, Callable[..., ImageSet]] = {
    "fashion_mnist": lambda split, data_dir=None, download=False: _load_fashion_mnist(
        split, data_dir, download),
    "cifar10": lambda split, data_dir=None, download=False: _load_tfds("cifar10", split, data_dir,
                                                                       download),
    "cifar100": lambda split, data_dir=None, download=False: _load_tfds("cifar100", split, data_dir,
                                                                        download),
    "stl10": lambda split, data_dir=None, download=False: _load_tfds("stl10", split, data_dir,
                                                                     download),
    "fashion_mnist_shifted": lambda split, data_dir=None, download=False: (
        _load_fashion_mnist_shifted(split, data_dir, download)),
    "synthetic": lambda split, data_dir=None, download=False: synthetic(split),
    "synthetic_leaves": lambda split, data_dir=None, download=False: dead_leaves(split),
}


# The images' shape of each source ([H, W, C]), known without loading it.
IMAGE_SHAPES = {"fashion_mnist": (28, 28, 1), "fashion_mnist_shifted": (28, 28, 1),
                "cifar10": (32, 32, 3), "cifar100": (32, 32, 3), "stl10": (96, 96, 3),
                "synthetic": (28, 28, 1), "synthetic_leaves": (28, 28, 1)}


def image_shape(name: str) -> tuple[int, int, int]:
  """The shape of source `name`'s images."""
  if name not in IMAGE_SHAPES:
    raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(IMAGE_SHAPES)}")
  return IMAGE_SHAPES[name]


def load(name: str, split: str, *, data_dir: str | None = None, download: bool = False) -> ImageSet:
  """Split `split` of source `name` (one of SOURCES) as uint8 images and int64 labels."""
  if name not in SOURCES:
    raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}")
  return SOURCES[name](split, data_dir=data_dir, download=download)
