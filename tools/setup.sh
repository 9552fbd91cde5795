#!/usr/bin/env bash
# Idempotent set-up for tff-ssl: a virtual environment with the pinned packages, TensorFlow Federated
# installed around its unmeetable jaxlib pin, and Debian's Fashion-MNIST. Fast when nothing changed.
#
#   TFF_SSL_VENV     where the virtual environment lives (default: <repo>/.venv)
#   PYTHON           interpreter to build it from (default: python3.11, else python3; must be 3.11)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TFF_SSL_VENV:-$root/.venv}
tff_version=0.87.0
fmnist_dir=/usr/share/datasets/fashion-mnist

say() { echo "[setup] $*" >&2; }

if [ -z "${PYTHON:-}" ]; then
  if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi

# 1. Virtual environment.
if [ ! -x "$venv/bin/python" ]; then
  version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$version" != "3.11" ]; then
    say "error: $PYTHON is Python $version; TensorFlow Federated 0.87 needs Python 3.11 (set PYTHON=/path/to/python3.11)"
    exit 2
  fi
  say "creating virtual environment in $venv"
  "$PYTHON" -m venv "$venv"
fi

# 2. Pinned packages, then TFF with --no-deps (its jax/jaxlib==0.4.14 pin cannot be met: jaxlib 0.4.14
#    was never published; jax/jaxlib 0.4.13 from requirements.txt satisfy its import). Re-run only when
#    requirements.txt or this script changed.
stamp="$venv/.tff-ssl-setup"
want=$(cat "$root/requirements.txt" "$root/tools/setup.sh" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing pinned packages (first run takes several minutes)"
  rm -f "$stamp"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/requirements.txt" 2>&1 \
    | { grep -v "^WARNING: Location" >&2 || true; }
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    "tensorflow-federated==$tff_version" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
  # The repository root goes on the venv's path, so that `tff_ssl` and `tasks` import from anywhere.
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$root" > "$site/tff_ssl_repo.pth"
  TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" - 2>/dev/null <<'PY'
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf, tensorflow_federated as tff, tensorflow_datasets as tfds
print("[setup] TensorFlow %s, TFF %s, tfds %s" % (tf.__version__, tff.__version__, tfds.__version__))
PY
  echo "$want" > "$stamp"
fi

# 3. Offline data: Debian's Fashion-MNIST (the four IDX files).
if [ -z "${TFF_SSL_FASHION_MNIST_DIR:-}" ] && [ ! -f "$fmnist_dir/train-images-idx3-ubyte.gz" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing Debian's dataset-fashion-mnist"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null; }
  else
    say "warning: Fashion-MNIST not found in $fmnist_dir and apt-get is unavailable (or not root);"
    say "         install dataset-fashion-mnist, or set TFF_SSL_FASHION_MNIST_DIR to the IDX files"
  fi
fi
