import json
import socket
import threading
import traceback

import pytest
import torch

from kvroute.errors import ConfigError, ModelLoadError, UnknownNameError
from kvroute.models import ZOO, load_model
from kvroute.models.loading import resolve_device, resolve_dtype


def test_unknown_model_lists_zoo_with_closest():
    with pytest.raises(UnknownNameError) as e:
        load_model("smollm2")
    msg = str(e.value)
    assert "did you mean 'smollm2-135m'" in msg
    for name in ZOO.names():
        assert name in msg
    assert "hub id" in msg


def test_hub_id_offline_fails_at_once_naming_pull(monkeypatch, tmp_path):
    """Offline (HF_HUB_OFFLINE set after huggingface_hub was imported, as in a long-lived process): the load
    fails without any attempt at the network, so it cannot wait for a timeout."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # what it read when imported, before the variable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    tried: list[str] = []  # offline means no attempt at the network at all (so it fails at once, not after a timeout)

    me = threading.get_ident()  # (a thread an earlier test left behind may use the network: not this load)

    def refuse(what):
        def call(*args, **kwargs):
            if threading.get_ident() == me:
                tried.append(what + ":\n" + "".join(traceback.format_stack(limit=30)))
            raise OSError(f"test: no {what} offline")
        return call

    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    with pytest.raises(ModelLoadError) as e:
        load_model("some-org/some-model-that-is-not-cached")
    assert tried == [], "\n".join(tried)
    msg = str(e.value)
    assert "kvroute models pull" in msg and "local folder" in msg
    assert "\n" not in msg


def test_missing_path_is_clear(tmp_path):
    with pytest.raises(ModelLoadError, match="no such"):
        load_model(str(tmp_path / "nothing.gguf"))
    with pytest.raises(ModelLoadError, match="no such"):
        load_model(str(tmp_path / "nothing") + "/")


def test_pickle_weights_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(ModelLoadError, match="pickle"):
        load_model(str(tmp_path))


def test_folder_roundtrip_of_tiny_model(tmp_path):
    from kvroute.models import tiny_model

    tiny = tiny_model("qwen2", seed=3)
    tiny.model.save_pretrained(tmp_path, safe_serialization=True)
    tiny.tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    assert lm.kind == "folder"
    assert lm.info == tiny.info
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(lm.model(ids).logits, tiny.model(ids).logits)


def test_dtype_and_device_resolution():
    cpu = torch.device("cpu")
    assert resolve_dtype(None, cpu) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16", cpu) == torch.bfloat16
    with pytest.raises(ConfigError, match="unknown dtype"):
        resolve_dtype("float8", cpu)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device("cuda")
    assert resolve_device(None).type in ("cpu", "cuda")
