"""A zoo model's tokenizer without its weights: read from the GGUF, identical to the pulled folder's.

``load_tokenizer`` on a zoo model that is not pulled downloads the GGUF and saves only the tokenizer
(and the model's config, from which transformers picks the tokenizer class), never the float32
weights. The files must be byte for byte those of a full pull, and the tokenizer must encode alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvroute.models import fetch, load_tokenizer
from kvroute.models.zoo import ZOO

pytestmark = pytest.mark.embedded

NAME = "smollm2-135m"
TEXT = "Maren Oskvold was born in Velkirra, 1995.\n<|im_start|>user\nWhere?<|im_end|> ‘quotes’ — ünïcode 日本語"


@pytest.fixture(scope="module")
def pulled() -> Path:
    return fetch.pull(ZOO.get(NAME))  # the default home: pulled once for the whole test run


def test_tokenizer_from_the_gguf_equals_the_pulled_one(pulled: Path, tmp_path: Path) -> None:
    entry = ZOO.get(NAME)
    gguf = fetch.gguf_path(entry)
    assert gguf.is_file(), "a pull keeps its verified GGUF"
    home = tmp_path / "home"
    (home / "downloads" / NAME).mkdir(parents=True)
    shutil.copy(gguf, home / "downloads" / NAME / gguf.name)  # verified GGUF present: nothing is downloaded

    tok = load_tokenizer(NAME, home=home)

    folder = fetch.tokenizer_dir(entry, home=home)
    assert not fetch.is_pulled(NAME, home) and not (home / "models").exists()  # no weights were converted
    assert not list(folder.glob("*.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (folder / name).read_bytes() == (pulled / name).read_bytes(), name
    ref = load_tokenizer(NAME)  # from the pulled folder
    assert type(tok) is type(ref)
    assert tok(TEXT)["input_ids"] == ref(TEXT)["input_ids"]
    assert tok.all_special_tokens == ref.all_special_tokens
    msgs = [{"role": "user", "content": "Where?"}]
    assert (tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))


def test_a_second_read_reuses_the_saved_tokenizer(pulled: Path, tmp_path: Path) -> None:
    entry = ZOO.get(NAME)
    home = tmp_path / "home"
    (home / "downloads" / NAME).mkdir(parents=True)
    shutil.copy(fetch.gguf_path(entry), home / "downloads" / NAME / fetch.gguf_path(entry).name)
    first = fetch.tokenizer_dir(entry, home=home)
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert fetch.tokenizer_dir(entry, home=home) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp  # not written again
