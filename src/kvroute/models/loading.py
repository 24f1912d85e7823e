"""One loading function for every model source.

``load_model(source)`` accepts a zoo name (pulled on first use), a local Hugging Face folder, a
``.gguf`` file, or a hub id (``org/name``). Weights load only from safetensors or GGUF, never from
pickle files, and ``trust_remote_code`` stays off unless asked for.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from kvroute.errors import ConfigError, ModelLoadError, UnknownNameError
from kvroute.models import fetch
from kvroute.models.zoo import ZOO, kvroute_home
from kvroute.progress import SILENT, Progress

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


@dataclass(frozen=True)
class ModelInfo:
    """The shape facts every later stage needs (named as in STYLE.md: L, H, Hkv, D)."""

    architecture: str
    num_layers: int  # L
    num_heads: int  # H (query heads)
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    context_window: int
    num_params: int

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group)."""
        return self.num_heads // self.num_kv_heads


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any
    name: str
    kind: str  # "zoo" | "folder" | "gguf" | "hub" | "tiny"
    path: str
    info: ModelInfo
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def model_info(model: Any) -> ModelInfo:
    cfg = model.config
    cfg = getattr(cfg, "text_config", cfg)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelInfo(
        architecture=cfg.model_type,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        context_window=int(getattr(cfg, "max_position_embeddings", 0) or 0),
        num_params=sum(p.numel() for p in model.parameters()),
    )


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} was asked for but CUDA is not available; use --device cpu")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None``/"auto": bfloat16 on CUDA, float32 on CPU (exact equivalence checks need float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of auto, float32, bfloat16, float16") from None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (honours HF_ENDPOINT and HF_HUB_OFFLINE)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _finish(model: Any, device: torch.device) -> Any:
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def _from_folder(path: Path, device: torch.device, dtype: torch.dtype, attn: str, trust: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json; it is not a Hugging Face model folder")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"{path} holds no .safetensors weights; kvroute does not load pickle (.bin/.pt) weights. "
            "Convert them once with transformers' save_pretrained(safe_serialization=True)."
        )
    with fetch.quiet_transformers():
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True,
                                                     attn_implementation=attn, trust_remote_code=trust)
    return model, tok


def _from_gguf(path: Path, device: torch.device, dtype: torch.dtype, attn: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with fetch.quiet_transformers():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                     attn_implementation=attn)
    return model, tok


def _from_hub(repo: str, dtype: torch.dtype, attn: str, trust: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    online = hub_reachable()
    kwargs = dict(dtype=dtype, use_safetensors=True, attn_implementation=attn, trust_remote_code=trust,
                  local_files_only=not online)
    try:
        with fetch.quiet_transformers():
            tok = AutoTokenizer.from_pretrained(repo, trust_remote_code=trust, local_files_only=not online)
            model = AutoModelForCausalLM.from_pretrained(repo, **kwargs)
    except OSError as e:
        if not online:
            raise ModelLoadError(
                f"cannot load {repo!r}: the Hugging Face hub is unreachable and the model is not in the local "
                f"hub cache. Use a zoo model (`kvroute models list`, `kvroute models pull NAME`) or a local folder."
            ) from None
        raise ModelLoadError(f"cannot load {repo!r} from the hub: {e}") from None
    return model, tok


def load_model(
    source: str,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    home: Path | None = None,
    progress: Progress = SILENT,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a zoo name, a folder, a ``.gguf`` file or a hub id."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    home = home or kvroute_home()
    meta: dict[str, Any] = {}
    path = Path(source).expanduser()
    if source in ZOO:
        entry = ZOO.get(source)
        folder = fetch.pull(entry, home=home, progress=progress)
        with progress.task(f"loading {source}", total=None):
            model, tok = _from_folder(folder, dev, dt, attn_implementation, False)
        kind, where, name = "zoo", str(folder), source
        meta["original"] = entry.original
    elif path.is_dir():
        model, tok = _from_folder(path, dev, dt, attn_implementation, trust_remote_code)
        kind, where, name = "folder", str(path), path.name
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"no such GGUF file: {path}")
        with progress.task(f"loading and dequantising {path.name}", total=None):
            model, tok = _from_gguf(path, dev, dt, attn_implementation)
        kind, where, name = "gguf", str(path), path.stem
    elif _HUB_ID.match(source) and not source.startswith((".", "/", "~")):
        with progress.task(f"loading {source} from the Hugging Face hub", total=None):
            model, tok = _from_hub(source, dt, attn_implementation, trust_remote_code)
        kind, where, name = "hub", source, source
    elif "/" in source or source.startswith((".", "~")):
        raise ModelLoadError(f"no such model folder or file: {path}")
    else:
        raise UnknownNameError("model", source, ZOO.names(), ZOO.hint)
    model = _finish(model, dev)
    if model.dtype != dt:
        model.to(dt)
    if getattr(tok, "pad_token", None) is None and getattr(tok, "eos_token", None) is not None:
        tok.pad_token = tok.eos_token
    log.info("loaded %s (%s) on %s as %s", name, kind, dev, dt)
    return LoadedModel(model=model, tokenizer=tok, name=name, kind=kind, path=where, info=model_info(model), meta=meta)


def load_tokenizer(source: str, *, home: Path | None = None, progress: Progress = SILENT) -> Any:
    """Only the tokenizer of ``source`` (a zoo model is pulled if needed)."""
    from transformers import AutoTokenizer

    home = home or kvroute_home()
    path = Path(source).expanduser()
    with fetch.quiet_transformers():
        if source in ZOO:
            return AutoTokenizer.from_pretrained(fetch.pull(ZOO.get(source), home=home, progress=progress))
        if path.is_dir():
            return AutoTokenizer.from_pretrained(path)
        if path.suffix == ".gguf" and path.is_file():
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        if _HUB_ID.match(source):
            return AutoTokenizer.from_pretrained(source, local_files_only=not hub_reachable())
    raise UnknownNameError("model", source, ZOO.names(), ZOO.hint)
