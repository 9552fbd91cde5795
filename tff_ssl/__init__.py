"""tff-ssl: federated self-supervised learning of image encoders in TensorFlow Federated.

Importing the package installs the TFF worker clean-up (`tff_ssl.runtime`): a program that uses the
library leaves no `worker_binary` running after it exits, on any exit path.
"""

from tff_ssl import runtime as _runtime

_runtime.install()
