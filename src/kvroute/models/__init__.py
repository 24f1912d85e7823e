"""Models: the embedded zoo, one loading function for every source, tiny test models."""

from kvroute.models.loading import LoadedModel, ModelInfo, load_model, load_tokenizer, model_info
from kvroute.models.tiny import save_tiny_model, tiny_model, tiny_tokenizer
from kvroute.models.zoo import DEFAULT_MODEL, ZOO, ZooEntry, kvroute_home

__all__ = ["DEFAULT_MODEL", "ZOO", "LoadedModel", "ModelInfo", "ZooEntry", "kvroute_home", "load_model",
           "load_tokenizer", "model_info", "save_tiny_model", "tiny_model", "tiny_tokenizer"]
