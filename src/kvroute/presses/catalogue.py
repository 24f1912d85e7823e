"""The kvpress catalogue through kvroute: every press kvpress 0.5.5 exports, and what kvroute makes of it.

Each kvpress press is one of:

- ``scorer`` / ``selection``: offered, under the kvroute spec given (a press's scorer runs its
  kvpress ``score()``; wrappers such as AdaKV or ChunkKV are kvroute selections), and checked
  against kvpress token for token (tests/reference, ``kvroute presses check``);
- ``weights``: needs learned weights that kvpress downloads from a model hub by model name; offered
  where a local path can be given instead (the ``weights`` or ``stats_folder`` parameter), otherwise
  listed with the reason;
- ``own ratio``: the press decides its own compression (a threshold, a share of heads, lazy
  layers), so its ratio is an outcome; a kvroute cell is one (press, ratio), set from outside;
- ``out of scope``: the press changes keys, channels or values, or compresses during decoding —
  what a keep mask over one shared prefill cannot express;
- ``not yet``: expressible as a keep mask, not implemented yet.

:data:`CATALOGUE` is torch-free (``kvroute presses list`` reads it without importing kvpress), and
tests/unit/test_catalogue.py holds it against kvpress's own export list, so a press kvpress adds in a
later version cannot go unlisted. A name a user gives that kvroute does not offer is answered from
here with its reason (:func:`unavailable`), not with "unknown name".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvroute.errors import ConfigError

OFFERED = ("scorer", "selection")


@dataclass(frozen=True)
class Entry:
    """One kvpress press: its class, how kvroute offers it (``status``), the kvroute spec, and why not when not."""

    kvpress: str  # the class name kvpress exports
    status: str  # "scorer" | "selection" | "weights" | "own ratio" | "out of scope" | "not yet" | "base class"
    kvroute: str = ""  # the kvroute press spec that is this press (SCORER: any scorer), empty when not offered
    why: str = ""  # the reason it is not offered, or what differs from kvpress

    @property
    def name(self) -> str:
        """kvpress's class name in kvroute's spelling: ``DuoAttentionPress`` → ``duo_attention``."""
        base = self.kvpress[: -len("Press")] if self.kvpress.endswith("Press") else self.kvpress
        return _SPECIAL.get(base, re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower())

    @property
    def offered(self) -> bool:
        return self.status in OFFERED or (self.status == "weights" and bool(self.kvroute))


_SPECIAL = {"KVzip": "kvzip", "KVzap": "kvzap", "KVgrad": "kvgrad", "KVCompose": "kvcompose", "CUR": "cur",
            "TOVA": "tova", "SnapKV": "snapkv", "StreamingLLM": "streaming_llm", "LagKV": "lagkv",
            "ChunkKV": "chunkkv", "EntropyGatedChunkKV": "entropy_chunkkv", "PyramidKV": "pyramid",
            "AdaKV": "adakv", "CriticalKV": "criticalkv", "CriticalAdaKV": "critical_adakv", "QFilter": "qfilter",
            "SimLayerKV": "simlayerkv", "ThinK": "think", "DMS": "dms", "LUKV": "lukv", "CAM": "cam",
            "FastKVzip": "fastkvzip", "RestoreKV": "restorekv", "KeyDiff": "keydiff", "Knorm": "knorm",
            "NonCausalAttn": "non_causal_attention", "LeverageScore": "leverage", "Random": "kvpress_random",
            "Cap": "cap", "ExpectedAttentionStats": "expected_attention_stats", "Finch": "finch"}

_DECODING = "compresses the cache while the answer is generated; kvroute perturbs the prefilled context only"

CATALOGUE: tuple[Entry, ...] = (
    # scorers: a kvpress ScorerPress (or its score()) through kvroute's adapter
    Entry("CapPress", "scorer", "cap"),
    Entry("CompactorPress", "scorer", "compactor"),
    Entry("CURPress", "scorer", "cur"),
    Entry("ExpectedAttentionPress", "scorer", "expected_attention"),
    Entry("FinchPress", "scorer", "finch",
          "question-aware regime only; without key re-rotation (rerotate_keys=True moves kept keys to new "
          "positions, which a mask cannot express); the window is read from the prompt, not from a delimiter token"),
    Entry("KeyDiffPress", "scorer", "keydiff"),
    Entry("KnormPress", "scorer", "knorm"),
    Entry("KVzipPress", "scorer", "kvzip", "default selection global (layerwise = global[per_layer=true])"),
    Entry("LagKVPress", "scorer", "lagkv"),
    Entry("LeverageScorePress", "scorer", "leverage"),
    Entry("NonCausalAttnPress", "scorer", "non_causal_attention"),
    Entry("ObservedAttentionPress", "scorer", "observed_attention"),
    Entry("RandomPress", "scorer", "kvpress_random"),
    Entry("SnapKVPress", "scorer", "snapkv"),
    Entry("StreamingLLMPress", "scorer", "streaming_llm"),
    Entry("TOVAPress", "scorer", "tova"),
    # selections: kvpress wrappers and pyramid budgets, as kvroute selection strategies
    Entry("AdaKVPress", "selection", "SCORER+adakv"),
    Entry("BlockPress", "selection", "SCORER+block"),
    Entry("ChunkPress", "selection", "SCORER+chunk"),
    Entry("ChunkKVPress", "selection", "SCORER+chunkkv"),
    Entry("CriticalKVPress", "selection", "SCORER+criticalkv"),
    Entry("CriticalAdaKVPress", "selection", "SCORER+critical_adakv"),
    Entry("EntropyGatedChunkKVPress", "selection", "SCORER+entropy_chunkkv"),
    Entry("PyramidKVPress", "selection", "snapkv+pyramid", "the pyramid's window_size must equal snapkv's"),
    # learned weights from a model hub
    Entry("QFilterPress", "weights", "qfilter[weights=FOLDER]",
          "learned Q-filters per model (kvpress downloads nthngdy/<model>_qfilt); give a local copy as weights=FOLDER"),
    Entry("KVzapPress", "weights", "kvzap[weights=FOLDER]",
          "a learned surrogate per model (kvpress downloads nvidia/KVzap-<type>-<model>); give a local copy as "
          "weights=FOLDER"),
    Entry("ExpectedAttentionStatsPress", "weights", "expected_attention_stats[stats_folder=FOLDER]",
          "query statistics per model (kvpress downloads alessiodevoto/exp_att_stats_…); give a local copy as "
          "stats_folder=FOLDER"),
    Entry("FastKVzipPress", "weights", "",
          "trained gates per model, downloaded from a model hub; kvroute cannot load them from a folder yet"),
    Entry("LUKVPress", "weights", "",
          "per-(model, scorer) budget curves, downloaded by URL; kvroute has no option for a local curve yet"),
    Entry("RestoreKVPress", "out of scope", "",
          "adds learned restore tokens (a LoRA pass) to the cache: the cache holds entries the prefill never made"),
    # the ratio is the press's outcome
    Entry("DuoAttentionPress", "own ratio", "",
          "its compression is an outcome of head_compression_ratio and of attention patterns downloaded per model "
          "(or computed on the fly); it cannot follow a ratio grid"),
    Entry("DMSPress", "own ratio", "",
          "evicts entries below a score threshold, so its ratio is an outcome; the trained DMS evictors live in "
          "model checkpoints (e.g. nvidia/Qwen3-8B-DMS-8x); it cannot follow a ratio grid"),
    Entry("SimLayerKVPress", "own ratio", "",
          "compresses the layers it finds lazy (a threshold on attention), so its ratio is an outcome; it cannot "
          "follow a ratio grid"),
    Entry("PerLayerCompressionPress", "own ratio", "",
          "takes a hand-written list of per-layer ratios; a kvroute cell has one ratio (pyramid, global and adakv "
          "spread one budget unevenly)"),
    # not a keep set over one prefill
    Entry("ThinKPress", "out of scope", "", "prunes key channels (dimensions), not entries"),
    Entry("KeyRerotationPress", "out of scope", "", "re-rotates the kept keys to new positions after pruning"),
    Entry("MergingPress", "out of scope", "", "merges evicted values into kept ones: the kept entries change"),
    Entry("KVComposePress", "out of scope", "",
          "builds composite tokens aligned across heads (structured), whose keys and values are re-assembled"),
    Entry("KVgradPress", "not yet", "",
          "needs a backward pass through KVzip's replay (gradient attribution), which kvroute does not run yet"),
    Entry("CAMPress", "out of scope", "", "merges values into neighbours during decoding"),
    Entry("DecodingPress", "out of scope", "", _DECODING),
    Entry("PrefillDecodingPress", "out of scope", "", _DECODING),
    Entry("CompressionRatioDecodingPress", "out of scope", "", _DECODING),
    Entry("ComposedPress", "out of scope", "",
          "chains presses, each scoring the previous one's pruned cache; a cell is one press's keep mask"),
    Entry("BasePress", "base class", "", "the base class of all presses"),
    Entry("ScorerPress", "base class", "", "the base class of scorers; any subclass works as module:Class"),
)


def by_name() -> dict[str, Entry]:
    """Every entry under kvroute's spelling and under kvpress's class name."""
    out: dict[str, Entry] = {}
    for e in CATALOGUE:
        out[e.name] = e
        out[e.kvpress] = e
    return out


def unavailable(name: str) -> ConfigError | None:
    """The error for a scorer name kvroute does not offer but kvpress has (None when the name is not one).

    A kvpress class name of an offered press is answered with kvroute's name for it, and a selection's
    name given as a scorer with how to write it.
    """
    e = by_name().get(name)
    if e is None:
        return None
    if name == e.kvpress and e.kvroute:
        return ConfigError(f"{name} is kvpress's class; in kvroute it is {e.kvroute!r}")
    if e.status == "selection":
        example = e.kvroute.replace("SCORER", "expected_attention")
        return ConfigError(f"{name} is a selection strategy, not a scorer: write a scorer before it, e.g. {example!r}")
    if e.offered:
        return None  # a registered scorer (or one with local weights): its own checks apply
    what = name if name == e.kvpress else f"{name} (kvpress {e.kvpress})"
    return ConfigError(f"{what} is not offered here: {e.why}")
