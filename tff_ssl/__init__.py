"""tff-ssl: federated self-supervised learning of image encoders in TensorFlow Federated."""
