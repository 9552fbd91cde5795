"""Image sources: IDX reading, Fashion-MNIST offline, tfds loaders (mocked), errors, synthetic."""

import gzip
import os
import struct

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tff_ssl import data
from tff_ssl.data import sources


def write_idx(path, array):
  with gzip.open(path, "wb") as f:
    f.write(struct.pack(">HBB", 0, 0x08, array.ndim))
    f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
    f.write(array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_fashion_mnist(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  arrays = {}
  for split, (img, lab) in sources._FASHION_MNIST_FILES.items():  # pylint: disable=protected-access
    n = 12 if split == "train" else 5
    arrays[split] = (rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n))
    write_idx(tmp_path / img, arrays[split][0])
    write_idx(tmp_path / lab, arrays[split][1])
  monkeypatch.setenv("TFF_SSL_FASHION_MNIST_DIR", str(tmp_path))
  return arrays


def test_fashion_mnist_reads_idx_files(tiny_fashion_mnist):
  for split in ("train", "test"):
    ds = data.load("fashion_mnist", split)
    images, labels = tiny_fashion_mnist[split]
    assert ds.images.dtype == np.uint8 and ds.images.shape == images.shape + (1,)
    np.testing.assert_array_equal(ds.images[..., 0], images)
    np.testing.assert_array_equal(ds.labels, labels)
    assert ds.num_classes == 10


def test_truncated_idx_file_is_rejected(tmp_path):
  path = str(tmp_path / "bad.gz")
  with gzip.open(path, "wb") as f:
    f.write(struct.pack(">HBB", 0, 0x08, 1) + struct.pack(">I", 10) + b"\x00" * 3)
  with pytest.raises(ValueError, match="truncated"):
    sources.read_idx(path)


@pytest.mark.skipif(sources.fashion_mnist_dir() is None or "TFF_SSL_FASHION_MNIST_DIR" in os.environ,
                    reason="needs Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist)")
def test_debian_fashion_mnist_has_the_real_splits():
  train, test = data.load("fashion_mnist", "train"), data.load("fashion_mnist", "test")
  assert train.images.shape == (60000, 28, 28, 1) and test.images.shape == (10000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(train.labels), [6000] * 10)


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, monkeypatch):
  monkeypatch.setenv("TFF_SSL_FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
  with pytest.raises(data.DataUnavailableError, match="apt-get install dataset-fashion-mnist") as e:
    data.load("fashion_mnist", "train", data_dir=str(tmp_path / "tfds"))
  assert "\n" not in str(e.value)


def test_missing_tfds_dataset_says_how_to_get_it(tmp_path):
  with pytest.raises(data.DataUnavailableError, match="tfds build cifar10") as e:
    data.load("cifar10", "train", data_dir=str(tmp_path))
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("name,split,shape,classes", [
    ("cifar10", "train", (32, 32, 3), 10),
    ("cifar100", "test", (32, 32, 3), 100),
    ("stl10", "train", (96, 96, 3), 10),
    ("stl10", "unlabelled", (96, 96, 3), 10),
])
def test_tfds_sources_load_through_real_tfds_code(name, split, shape, classes, tmp_path):
  with tfds.testing.mock_data(num_examples=7, data_dir=str(tmp_path)):
    ds = data.load(name, split)
  assert ds.images.dtype == np.uint8 and ds.images.shape == (7,) + shape
  assert ds.labels.dtype == np.int64 and ds.num_classes == classes
  if split == "unlabelled":
    np.testing.assert_array_equal(ds.labels, data.UNLABELED)
  else:
    assert ((ds.labels >= 0) & (ds.labels < classes)).all()


def test_unknown_dataset_and_split_raise():
  with pytest.raises(ValueError, match=r"unknown dataset 'mnist'; choose one of \['cifar10'"):
    data.load("mnist", "train")
  with pytest.raises(ValueError, match="unknown split 'unlabelled' for cifar10"):
    data.load("cifar10", "unlabelled")


def test_synthetic_is_deterministic_and_class_structured():
  a, b = data.synthetic("train", seed=3), data.synthetic("train", seed=3)
  np.testing.assert_array_equal(a.images, b.images)
  np.testing.assert_array_equal(a.labels, b.labels)
  assert not np.array_equal(a.images, data.synthetic("test", seed=3).images[:0].sum() + a.images * 0
                            + data.synthetic("train", seed=4).images)
  assert a.images.shape == (2000, 28, 28, 1) and np.bincount(a.labels).tolist() == [200] * 10
  rgb = data.synthetic("test", num_examples=20, image_size=32, channels=3, num_classes=4)
  assert rgb.images.shape == (20, 32, 32, 3) and rgb.num_classes == 4


def test_image_set_validates_shapes():
  with pytest.raises(ValueError, match="uint8"):
    data.ImageSet(np.zeros((2, 4, 4, 1), np.float32), np.zeros(2, np.int64), 2)
  with pytest.raises(ValueError, match="one label per image"):
    data.ImageSet(np.zeros((2, 4, 4, 1), np.uint8), np.zeros(3, np.int64), 2)


def test_shift_images_moves_each_image_by_its_offset_with_zero_fill():
  image = np.arange(1, 26, dtype=np.uint8).reshape(1, 5, 5, 1)
  images = np.concatenate([image, image, image])
  out = sources.shift_images(images, np.array([[1, -2], [0, 0], [-5, 0]]))
  want = np.zeros((5, 5), np.uint8)
  want[1:, :3] = image[0, :4, 2:, 0]  # One row down, two columns left.
  np.testing.assert_array_equal(out[0, ..., 0], want)
  np.testing.assert_array_equal(out[1], image[0])
  assert not out[2].any()  # Moved out of the frame.
  assert out.dtype == np.uint8 and out.shape == images.shape


def test_shift_offsets_are_fixed_bounded_and_differ_by_split():
  a = sources.shift_offsets(5000, "train")
  np.testing.assert_array_equal(a, sources.shift_offsets(5000, "train"))
  np.testing.assert_array_equal(a[:10], sources.shift_offsets(10, "train"))  # By position.
  assert a.min() == -4 and a.max() == 4 and len(np.unique(a, axis=0)) == 81
  assert not np.array_equal(a[:100], sources.shift_offsets(100, "test"))


def test_fashion_mnist_shifted_is_fashion_mnist_moved(tiny_fashion_mnist):  # pylint: disable=unused-argument
  for split in ("train", "test"):
    base, moved = data.load("fashion_mnist", split), data.load("fashion_mnist_shifted", split)
    np.testing.assert_array_equal(moved.labels, base.labels)
    np.testing.assert_array_equal(
        moved.images, sources.shift_images(base.images, sources.shift_offsets(len(base), split)))
    assert moved.name == "fashion_mnist_shifted" and moved.num_classes == 10
    assert data.image_shape("fashion_mnist_shifted") == moved.image_shape
  with pytest.raises(ValueError, match="unknown split 'unlabelled' for fashion_mnist"):
    data.load("fashion_mnist_shifted", "unlabelled")


def test_dead_leaves_are_seeded_procedural_images_with_the_front_leafs_shape():
  a = sources.dead_leaves("train", num_examples=400, seed=1)
  b = sources.dead_leaves("train", num_examples=400, seed=1)
  np.testing.assert_array_equal(a.images, b.images)
  np.testing.assert_array_equal(a.labels, b.labels)
  assert not np.array_equal(a.images, sources.dead_leaves("test", num_examples=400, seed=1).images)
  assert not np.array_equal(a.images, sources.dead_leaves("train", num_examples=400, seed=2).images)
  assert a.images.shape == (400, 28, 28, 1) and a.images.dtype == np.uint8
  assert a.num_classes == len(sources.LEAF_SHAPES) == 4
  assert all(70 <= n <= 130 for n in np.bincount(a.labels, minlength=4))  # Uniform shapes.
  # Occlusion: many gray levels an image (its leaves), yet one leaf over a background is two.
  assert np.median([len(np.unique(im)) for im in a.images]) >= 8
  one = sources.dead_leaves("train", num_examples=200, leaves=1, seed=1)
  assert max(len(np.unique(im)) for im in one.images) <= 2
  assert sources.image_shape("synthetic_leaves") == (28, 28, 1)
  assert "synthetic_leaves" in sources.SOURCES
