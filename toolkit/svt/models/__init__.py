"""Loading local Hugging Face model pairs and the built-in tiny pair."""

from svt.models.loading import ModelPair, load_pair, resolve_device

__all__ = ["ModelPair", "load_pair", "resolve_device"]
