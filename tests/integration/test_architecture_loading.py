"""Every architecture of the tiny-model registry loads through kvroute's one loading path, offline.

For each architecture (:data:`kvroute.models.tiny.TINY_ARCHITECTURES`): a hub id whose files are in the local hub
cache loads as its saved folder does (``kind == "hub"``, same shape facts and logits), a hub id that cannot be
downloaded (not cached, or cached without its weights: a download cut short) fails in one line that names the way
out, and ``kvroute run --model ./folder`` runs on the saved folder. No network: ``HF_HUB_OFFLINE`` is set and every
socket call raises, so a load that tried the hub would fail these tests instead of waiting for a timeout.
"""

import json
import shutil
import socket

import pytest
import torch

from kvroute.errors import ModelLoadError
from kvroute.models import load_model
from kvroute.models.tiny import TINY_ARCHITECTURES, save_tiny_model

ARCHS = list(TINY_ARCHITECTURES)
ORG = "kvroute-test"
COMMIT = "0" * 40


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """The hub unreachable and offline, its cache an empty folder of this test's; returns that cache."""
    from huggingface_hub import constants

    def refuse(*args, **kwargs):
        raise OSError("test: no network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read by transformers at each call
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return cache


def _smallest(arch):
    spec = TINY_ARCHITECTURES[arch]
    return spec.sizes(min(spec.head_dims))


def _cache_as_hub_repo(cache, folder, repo, *, weights=True):
    """Lay ``folder``'s files out as huggingface_hub caches a download of ``repo`` (one snapshot, refs/main)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    for f in folder.iterdir():
        if weights or f.suffix != ".safetensors":
            shutil.copy(f, snap / f.name)


def _one_line_offline(e, repo):
    msg = str(e.value)
    assert msg.startswith(f"cannot load {repo!r}: the Hugging Face hub is unreachable"), msg
    assert "local folder" in msg and "kvroute models pull" in msg and "\n" not in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__  # raised `from None`: no chained traceback


@pytest.mark.parametrize("arch", ARCHS)
def test_a_hub_id_of_each_architecture_loads_from_the_cache_or_fails_in_one_line(arch, offline, tmp_path):
    folder = save_tiny_model(tmp_path / arch, arch, **_smallest(arch))
    cached, partial, absent = f"{ORG}/tiny-{arch}", f"{ORG}/tiny-{arch}-partial", f"{ORG}/tiny-{arch}-absent"
    _cache_as_hub_repo(offline, folder, cached)
    _cache_as_hub_repo(offline, folder, partial, weights=False)

    hub, local = load_model(cached), load_model(str(folder))
    assert (hub.kind, hub.name, local.kind) == ("hub", cached, "folder")
    assert hub.info == local.info
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(hub.model(ids).logits, local.model(ids).logits, atol=0, rtol=0)
    for repo in (partial, absent):
        with pytest.raises(ModelLoadError) as e:
            load_model(repo)
        _one_line_offline(e, repo)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=[] if a == "gemma3" else pytest.mark.slow) for a in ARCHS])
def test_kvroute_run_reads_a_saved_folder_of_each_architecture(arch, offline, tmp_path, monkeypatch, capsys):
    """``kvroute run --model ./folder`` (a relative path, as a user types it) on each architecture: every cell is
    computed (no cell error), offline."""
    from kvroute.cli import main
    from kvroute.tasks import TaskSpec, generate_tasks, save_tasks

    monkeypatch.setenv("KVROUTE_KEPT_KERNEL", "0")
    save_tiny_model(tmp_path / "folder", arch, **_smallest(arch))
    save_tasks(generate_tasks(TaskSpec("base", n=1, seed=0)), tmp_path / "t.jsonl")
    monkeypatch.chdir(tmp_path)
    try:
        main(["run", "--model", "./folder", "--tasks", "t.jsonl", "--press", "knorm", "--press", "snapkv",
              "--ratio", "0.5", "--max-new-tokens", "3", "--out", "o.jsonl"])
    except SystemExit as e:
        assert not e.code, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {r["press"] for r in records} == {"knorm", "snapkv"}
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    assert {r["model"] for r in records} == {"./folder"}  # the model as the user named it
