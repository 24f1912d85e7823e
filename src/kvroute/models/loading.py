"""One loading function for every model source.

``load_model(source)`` accepts a zoo name (pulled on first use), a local Hugging Face folder, a
``.gguf`` file, or a hub id (``org/name``). Weights load only from safetensors or GGUF, never from
pickle files, and ``trust_remote_code`` stays off unless asked for.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvroute.errors import ConfigError, ModelLoadError, UnknownNameError, suggest
from kvroute.hub import hub_offline, hub_reachable
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
    # the layers a press compresses, as kvpress hooks them (None: every layer; Gemma 3's global layers only)
    compressed_layers: tuple[int, ...] | None = None

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


def _text_config(model: Any) -> Any:
    cfg = model.config
    return getattr(cfg, "text_config", cfg)


def sliding_layers(config: Any) -> tuple[list[bool], int | None]:
    """Which layers of a (text) config attend through a sliding window, and the window (tokens; None: none does).

    As transformers builds the cache: ``layer_types`` where the config has them, else every layer slides when
    ``sliding_window`` is set (Mistral v0.1, Phi-3 mini: one window over all layers)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        return [window is not None] * int(config.num_hidden_layers), window
    sliding = [t in ("sliding_attention", "chunked_attention") for t in types]
    return sliding, window if any(sliding) else None


def compressed_layers(model: Any) -> tuple[int, ...] | None:
    """The layers kvpress compresses in ``model`` (None: every layer).

    kvpress 0.5.5 hooks every decoder layer, except the sliding-window layers of a
    ``Gemma3ForConditionalGeneration`` (Gemma 3 4B-27B; ``BasePress.__call__`` skips ``self_attn.is_sliding``):
    only its global layers are compressed, each by the press's ratio, and the sliding layers keep their whole
    cache. A text-only ``Gemma3ForCausalLM`` (Gemma 3 1B) has every layer compressed, as any model."""
    from kvroute.models.layers import decoder_layers

    if type(model).__name__ != "Gemma3ForConditionalGeneration":
        return None
    layers = decoder_layers(model)
    return tuple(i for i, layer in enumerate(layers) if not getattr(layer.self_attn, "is_sliding", False))


def model_info(model: Any) -> ModelInfo:
    """The shape facts of ``model``. Where a layer attends through a sliding window, the context window is
    that window (a prompt and answer inside it see every token, as full attention does)."""
    cfg = _text_config(model)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    window = int(getattr(cfg, "max_position_embeddings", 0) or 0)
    sliding, size = sliding_layers(cfg)
    if size is not None and any(sliding):  # past the window a sliding layer no longer sees the whole context
        window = min(window, int(size)) if window else int(size)
    return ModelInfo(
        architecture=cfg.model_type,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        context_window=window,
        num_params=sum(p.numel() for p in model.parameters()),
        compressed_layers=compressed_layers(model),
    )


def architecture_problem(model: Any) -> str | None:
    """What kvroute lacks to study ``model``'s architecture, in words (None: nothing).

    kvroute's keep masks, GER and reachability are defined over a context every compressed layer sees whole, through
    one query projection (``q_proj``, or Phi-3's fused ``qkv_proj``) and plain softmax attention. Sliding-window
    layers are studied where the prompt and answer fit inside the window (the context window is then that window:
    :func:`model_info`), compressed or left whole as kvpress does (:func:`compressed_layers`); soft-capped attention
    logits (Gemma 2) are not modelled."""
    from kvroute.models.layers import decoder_layers
    from kvroute.models.queries import query_projection

    cfg = _text_config(model)
    cap = getattr(cfg, "attn_logit_softcapping", None)
    if cap is not None:
        return (f"its attention logits are soft-capped (attn_logit_softcapping={cap}), which kvroute's masked "
                "attention does not apply")
    try:
        layers = decoder_layers(model)
    except TypeError as e:
        return str(e)
    attn = getattr(layers[0], "self_attn", None) if layers else None
    if attn is None or query_projection(attn) is None:
        kind = type(attn).__name__ if attn is not None else "no self_attn module"
        return (f"its attention ({kind}) has neither a q_proj nor a fused qkv_proj from which the scorers' queries "
                "come")
    return None


def check_architecture(model: Any, name: str) -> None:
    """Refuse, at load and in one line, a model whose architecture kvroute cannot study (:func:`architecture_problem`),
    instead of a traceback or every cell erroring later."""
    problem = architecture_problem(model)
    if problem:
        arch = getattr(_text_config(model), "model_type", type(model).__name__)
        raise ModelLoadError(f"kvroute cannot study {name} ({arch}) yet: {problem}; models whose layers attend to "
                             "the whole context, or to a sliding window the prompt fits in (Llama, Mistral, Qwen2, "
                             "Qwen3, Phi-3, Gemma 3), are supported")


_DEVICE = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")
DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` (auto, cpu, cuda, cuda:N, mps) as a torch device; anything else, or a device this machine
    lacks, raises :class:`~kvroute.errors.ConfigError` naming the allowed values (every command's check)."""
    if device is None or str(device).strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    text = str(device).strip().lower()
    if not _DEVICE.match(text):
        close = suggest(text, ["auto", "cpu", "cuda", "cuda:0", "mps"])
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ";"
        raise ConfigError(f"unknown device {str(device)!r}{hint} use one of {', '.join(DEVICES)}")
    dev = torch.device(text)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} was asked for but CUDA is not available; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                          f"cuda:0 … cuda:{torch.cuda.device_count() - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {str(device)!r} was asked for but MPS is not available; use --device cpu")
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


def _finish(model: Any, device: torch.device) -> Any:
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def check_model_folder(path: Path, *, trust: bool = False, fix: str | None = None) -> None:
    """Refuse, in one line, a folder transformers would fail on with a traceback.

    No ``config.json`` (or not JSON), no safetensors weights, custom model code (``auto_map`` for an
    architecture transformers does not know: kvroute runs no code from a model folder unless
    ``trust_remote_code``), or a truncated/damaged ``*.safetensors`` (checked from its header).
    ``fix`` is what the user should do about damaged weights (default: save or copy them again).
    """
    import json

    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{path} has no config.json; it is not a Hugging Face model folder")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({e}); save or copy the model folder again") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file} must hold a JSON object")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(
            f"{path} holds no .safetensors weights; kvroute does not load pickle (.bin/.pt) weights. "
            "Convert them once with transformers' save_pretrained(safe_serialization=True)."
        )
    if cfg.get("auto_map") and not trust:
        from transformers import CONFIG_MAPPING

        if cfg.get("model_type") not in CONFIG_MAPPING:
            classes = ", ".join(sorted(cfg["auto_map"])) if isinstance(cfg["auto_map"], dict) else "auto_map"
            raise ModelLoadError(
                f"{path} needs its own model code (auto_map in config.json: {classes}; model_type "
                f"{cfg.get('model_type')!r} is not built into transformers); kvroute does not run code from a model "
                "folder. Use a model of an architecture transformers ships, or review the code and load it in Python "
                "with load_model(..., trust_remote_code=True)")
    for f in sorted(path.glob("*.safetensors")):
        problem = fetch.safetensors_problem(f)
        if problem:
            raise ModelLoadError(f"{f} is not a complete safetensors file ({problem}); "
                                 f"{fix or 'save or copy the model folder again'}")


def _from_folder(path: Path, device: torch.device, dtype: torch.dtype, attn: str, trust: bool,
                 fix: str | None = None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_folder(path, trust=trust, fix=fix)
    try:
        with fetch.quiet_transformers():
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True,
                                                         attn_implementation=attn, trust_remote_code=trust)
    except ValueError as e:  # e.g. custom code the checks above did not foresee
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{path} needs its own model code; kvroute does not run code from a model folder "
                                 "(load it in Python with load_model(..., trust_remote_code=True) after reviewing "
                                 "the code)") from None
        raise
    except Exception as e:
        if type(e).__name__ == "SafetensorError":  # safetensors' own error type (a Rust exception)
            raise ModelLoadError(f"cannot read the weights in {path} ({e}); "
                                 f"{fix or 'save or copy the model folder again'}") from None
        raise
    _quiet_length_warning(tok)
    return model, tok


def _quiet_length_warning(tok: Any) -> None:
    """Silence the tokenizer's "Token indices sequence length is longer than …" warning.

    kvroute checks every prompt against the model's window itself (with its own message), and the
    warning would otherwise print into ``run`` output once per process. transformers records a
    warning it has given in ``deprecation_warnings``; marking this one given keeps it quiet.
    """
    warned = getattr(tok, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True


def _from_gguf(path: Path, device: torch.device, dtype: torch.dtype, attn: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with fetch.quiet_transformers():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                     attn_implementation=attn)
    _quiet_length_warning(tok)
    return model, tok


def _from_hub(repo: str, dtype: torch.dtype, attn: str, trust: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    online = hub_reachable()
    kwargs = dict(dtype=dtype, use_safetensors=True, attn_implementation=attn, trust_remote_code=trust,
                  local_files_only=not online)
    try:
        with fetch.quiet_transformers(), hub_offline(not online):
            tok = AutoTokenizer.from_pretrained(repo, trust_remote_code=trust, local_files_only=not online)
            model = AutoModelForCausalLM.from_pretrained(repo, **kwargs)
    except OSError as e:
        if not online:
            raise ModelLoadError(
                f"cannot load {repo!r}: the Hugging Face hub is unreachable and the model is not in the local "
                f"hub cache. Use a zoo model (`kvroute models list`, `kvroute models pull NAME`) or a local folder."
            ) from None
        raise ModelLoadError(f"cannot load {repo!r} from the hub: {e}") from None
    _quiet_length_warning(tok)
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
            model, tok = _from_folder(folder, dev, dt, attn_implementation, False,
                                      fix=f"pull it again: kvroute models pull {source} --force")
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
    check_architecture(model, name)
    model = _finish(model, dev)
    if model.dtype != dt:
        model.to(dt)
    if getattr(tok, "pad_token", None) is None and getattr(tok, "eos_token", None) is not None:
        tok.pad_token = tok.eos_token
    log.info("loaded %s (%s) on %s as %s", name, kind, dev, dt)
    return LoadedModel(model=model, tokenizer=tok, name=name, kind=kind, path=where, info=model_info(model), meta=meta)


def load_tokenizer(source: str, *, home: Path | None = None, progress: Progress = SILENT) -> Any:
    """Only the tokenizer of ``source``; a zoo model not pulled yet is read from its GGUF (downloaded, not
    converted)."""
    from transformers import AutoTokenizer

    home = home or kvroute_home()
    path = Path(source).expanduser()
    tok = None
    with fetch.quiet_transformers():
        if source in ZOO:
            tok = AutoTokenizer.from_pretrained(fetch.tokenizer_dir(ZOO.get(source), home=home, progress=progress))
        elif path.is_dir():
            tok = AutoTokenizer.from_pretrained(path)
        elif path.suffix == ".gguf" and path.is_file():
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        elif _HUB_ID.match(source):
            online = hub_reachable()
            with hub_offline(not online):
                tok = AutoTokenizer.from_pretrained(source, local_files_only=not online)
    if tok is None:
        raise UnknownNameError("model", source, ZOO.names(), ZOO.hint)
    _quiet_length_warning(tok)
    return tok
