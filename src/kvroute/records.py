"""The record schema: one row per (model, instance, press, ratio, regime, seed) cell.

This is the contract between the engine/metrics (which produce records), the store (which keeps
them), and the analysis/report (which reads only the store). Scalars are plain columns; per-layer
vectors are lists of floats (stored compactly as JSON/float32 blobs by the store).

Keep this file the single place where record fields are named and described.
"""

from __future__ import annotations

# Identity of a cell ------------------------------------------------------------------------------
KEY_FIELDS: dict[str, str] = {
    "model": "model name as given (zoo name, folder, hub id)",
    "instance_id": "task instance content hash",
    "press": "press spec as written, e.g. 'expected_attention+adakv' ('none' at ratio 0 baseline)",
    "ratio": "compression ratio α: fraction of context KV entries removed per (layer, KV head)",
    "regime": "'agnostic' (question appended after compression) or 'aware' (question compressed too)",
    "seed": "sweep seed (task generation and random scorers)",
    "settings": "hash of the decoding/metric settings that change results",
}

# Task tags copied onto each record, for breakdowns --------------------------------------------------
TASK_FIELDS: dict[str, str] = {
    "family": "task family (base, knowledge, multi_presence, multi_entity, coreference, long_context, hops, ...)",
    "answer_type": "Person | Thing | Organization | Creature | Location | Numeral | Date/Time | Event",
    "question_type": "Standard | Manipulated | Part",
    "unanswerable": "bool: gold answer is 'I don't know'",
    "context_tokens": "T: number of context tokens the press may compress",
    "difficulty": "generator difficulty level (int) or null",
    "evidence": "'located' or 'none' (no answer occurrence found in the context: GER undefined, counted apart)",
    "depth": "needle / fact depth in [0, 1] when the generator records one (niah, long_context), else null",
    "target_length": "the generator's requested context length in tokens, when it records one, else null",
}

# Press bookkeeping ----------------------------------------------------------------------------------
PRESS_FIELDS: dict[str, str] = {
    "scorer": "scorer name, e.g. 'expected_attention'",
    "selection": "selection strategy, e.g. 'per_head', 'adakv', 'chunk', 'pyramid', 'shared', 'routes'",
    "kept_fraction": "realised fraction of context entries kept, over all (layer, KV head)",
}

# Scalar metrics ------------------------------------------------------------------------------------
METRIC_FIELDS: dict[str, str] = {
    "answer": "greedy answer text",
    "f1": "SQuAD-normalised token F1 against the gold answers",
    "exact": "SQuAD-normalised exact match (0/1)",
    "outcome": "correct | partial | abstained | distractor | fabricated",
    "hallucinated": "bool: outcome in (distractor, fabricated), or a non-abstention on an unanswerable item",
    "ger": "Global Eviction Ratio on answer tokens: share of (layer, t in T_ans) evicted from every KV head",
    "ger_all_layers": "share of t in T_ans evicted from every head of every layer",
    "ger_evidence": "GER on evidence tokens T_ev",
    "ger_evidence_all_layers": "ger_all_layers on evidence tokens",
    "eviction_rate": "share of (layer, t) context tokens evicted from every KV head",
    "evidence_heads": "number of (layer, KV head) pairs keeping at least one evidence token (redundancy k)",
    "answer_heads": "number of (layer, KV head) pairs keeping at least one answer token",
    "evidence_attention_mass": "attention mass from the last prompt token onto T_ev, mean over layers and query heads",
    "evidence_attention_mass_full": "the same with the full (uncompressed) cache",
    "reachable": "bool: direct reachability (some layer/head keeps an evidence token with attention > ε)",
    "routed_reachable": "bool: reachability through the prefill's context-to-context attention over survivors",
    "gold_logprob": "teacher-forced log-probability of the gold answer",
    "gold_logprob_delta": "gold_logprob compressed minus full",
}

# Per-layer vectors (length L) -----------------------------------------------------------------------
LAYER_FIELDS: dict[str, str] = {
    "consensus": "Consensus(ℓ) at the last prompt token = distinct argmax keys / query heads",
    "consensus_nosink": "Consensus(ℓ) ignoring the first n_sink positions",
    "rho": "agreement fraction ρ_ℓ = largest share of heads sharing one argmax key",
    "rho_nosink": "ρ_ℓ ignoring the first n_sink positions",
    "evidence_mass_layer": "attention mass onto T_ev from the last prompt token per layer (mean over heads)",
    "hidden_cosine": "cosine of compressed vs full last-prompt-token hidden state per layer",
}

ALL_FIELDS: dict[str, str] = {**KEY_FIELDS, **TASK_FIELDS, **PRESS_FIELDS, **METRIC_FIELDS, **LAYER_FIELDS}
