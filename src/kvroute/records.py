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
    "restore": "restore condition put back into the press's mask (kvroute.presses.restore), e.g. 'answer' or "
               "'answer@layers:late'; null for the press's own mask",
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
    "gold": "the gold answers (a list of strings; 'I don't know' on an unanswerable item)",
    "conversation": "with decoding.history set: the id of the context the instance's conversation shares (absent "
                    "otherwise)",
    "turn": "with decoding.history set: the question's turn in its conversation, 1-based (its cache holds the "
            "compressed context and the earlier turns' questions and answers uncompressed)",
    "turns": "with decoding.history set: the number of questions of the conversation",
}

# Press bookkeeping ----------------------------------------------------------------------------------
PRESS_FIELDS: dict[str, str] = {
    "scorer": "scorer name, e.g. 'expected_attention'",
    "selection": "selection strategy, e.g. 'per_head', 'adakv', 'chunk', 'pyramid', 'shared', 'routes'",
    "kept_fraction": "realised fraction of context entries kept, over all (layer, KV head)",
}

# Whether the cell ran ------------------------------------------------------------------------------
# An errored cell keeps its key, press and task fields but has no metric or per-layer field; the
# store counts it as finished (a resume does not recompute it), the analysis leaves it out of every
# estimate and the summary counts it per (model, press, error).
STATUS_FIELDS: dict[str, str] = {
    "status": "'ok' (the metrics below were computed) or 'error' (they were not; see error)",
    "error": "why an errored cell failed, one line: 'ExceptionType: message' (absent when status is 'ok')",
}

# Timings of the instance the cell was computed with (every cell of an instance shares them) ------------
TIMING_FIELDS: dict[str, str] = {
    "model_params": "the model's parameter count as loaded (for α* against model size; null in older runs)",
    "seconds_prefill": "seconds of the instance's one prefill (scorers captured), shared by its cells",
    "seconds_decode": "seconds of the instance's batched decode of all its cells, shared by its cells",
}

# Scalar metrics ------------------------------------------------------------------------------------
METRIC_FIELDS: dict[str, str] = {
    "answer": "greedy answer text",
    "f1": "SQuAD-normalised token F1 against the gold answers",
    "exact": "SQuAD-normalised exact match (0/1)",
    "outcome": "listed | correct | distractor | abstained | partial | fabricated (decided in this order; listed: "
               "the gold and another candidate value named, a failure; see kvroute.metrics.hallucination)",
    "hallucinated": "bool: outcome in (distractor, fabricated), not listed; on an unanswerable item, any answer "
                    "other than an abstention that names no candidate value",
    "ger": "Global Eviction Ratio on answer tokens: share of (layer, t in T_ans) evicted from every KV head",
    "ger_all_layers": "share of t in T_ans evicted from every head of every layer",
    "ger_evidence": "GER on evidence tokens T_ev",
    "ger_evidence_all_layers": "ger_all_layers on evidence tokens",
    "eviction_rate": "share of (layer, t) context tokens evicted from every KV head",
    "evidence_heads": "number of (layer, KV head) pairs keeping at least one evidence token (redundancy k)",
    "answer_heads": "number of (layer, KV head) pairs keeping at least one answer token",
    "answer_kept_heads": "per layer, per KV head ([L][Hkv] lists): the share of the answer's context tokens "
                         "that head keeps (metric 'retrieval'; with the model's retrieval heads it gives the answer's "
                         "survival in them)",
    "retrieval_hits": "full-cache cells only, per layer, per query head ([L][H] lists of counts): how many of the "
                      "answer tokens the model generated were generated while that head attended most to a context "
                      "position of the answer holding that same token (the retrieval-head criterion of Wu et al. "
                      "2024; metric 'retrieval')",
    "retrieval_events": "full-cache cells only: generated tokens that copy an answer token of the context (the "
                        "denominator of the retrieval score)",
    "evidence_attention_mass": "attention mass from the last prompt token onto T_ev, mean over layers and query heads",
    "evidence_attention_mass_full": "the same with the full (uncompressed) cache",
    "answer_attention_mass": "attention mass from the last prompt token onto the answer tokens T_ans, mean over layers "
                             "and query heads (null when the answer is not in the context)",
    "answer_attention_mass_full": "the same with the full (uncompressed) cache",
    "generated_evidence_mass": "attention mass onto T_ev from the generated answer tokens, mean over tokens, layers "
                               "and query heads (null without a generated token)",
    "reachable": "bool: direct reachability (some layer/head keeps an evidence token with attention > ε)",
    "routed_reachable": "bool (calibrated, layer-max): per layer, the direct attention mass of the last prompt token "
                        "onto the evidence and its routed read through the surviving entries (rollout over the "
                        "prefill), each standardised against the null sources (mutually disjoint shifted copies of the "
                        "evidence pattern, each source against the others: leave one out); the evidence's maximum over "
                        "the 2L columns beats the nulls' own maxima: p = (1 + #null max ≥ evidence max) / (1 + null "
                        "draws) ≤ route_alpha; None when the document holds too few disjoint null sources (fewer than "
                        "19 at the defaults, e.g. a 3-sentence passage). Stores made before the layer-max test held "
                        "the pooled test here (the loader moves it to routed_reachable_pooled)",
    "routed_p": "layer-max rank-test p-value (1 + #null max ≥ evidence max) / (1 + null draws)",
    "routed_z": "the evidence's largest standardised statistic over the 2L (layer, kind) columns",
    "routed_layer": "layer (1 … L) whose statistic gave routed_z (given when routed_z > 0, also when undecided)",
    "routed_kind": "which statistic gave routed_z: direct (attention onto the evidence) or rollout (routed read)",
    "routed_null_draws": "number of disjoint null sources the document allowed (route_null when it has room)",
    "routed_reachable_pooled": "bool: the pooled test — routed_evidence_mass beats the null sources' pooled masses at "
                               "route_alpha; insensitive at the full cache (most heads never look at the evidence)",
    "routed_p_pooled": "pooled rank-test p-value (1 + #null ≥ evidence) / (1 + null draws)",
    "routed_z_pooled": "(routed_evidence_mass − null mean) / null sd",
    "routed_evidence_mass": "pooled routed statistic: Σ_t attention(last prompt token → kept t) · rollout "
                            "evidence share of t, mean over layers and query heads",
    "routed_null_mass": "mean of the pooled statistic over the null sources",
    "routed_null_q95": "95th percentile of the pooled null statistic",
    "routed_reachable_uncalibrated": "bool: former rule — some head attends above ε a kept token whose rollout share "
                                     "is ≥ τ · the best evidence token's; true almost everywhere (rollout diffuses)",
    "gold_logprob": "teacher-forced log-probability of the gold answer",
    "gold_logprob_full": "gold_logprob with the full (uncompressed) cache",
    "gold_logprob_delta": "gold_logprob compressed minus full",
    "answer_tokens": "number of generated answer tokens",
    "hidden_cosine_last": "hidden_cosine at the last layer",
    "probe_features": "CONTROL (reads the question): last-prompt-token hidden state at probe_layer, the answer-type "
                      "probe's input; the type follows from the never-compressed question, so it cannot see evidence "
                      "loss",
    "probe_layer": "layer (1 … L) whose hidden state is probe_features",
    "lens_gold_logprob_final": "logit lens at the last prompt token, last layer: log p of the gold answer's first "
                               "in-context token (= the model's own next-token log-prob)",
    "lens_gold_rank_final": "rank of the gold's first token in the model's next-token distribution (0 = top-1)",
    "lens_gold_logprob_delta": "lens_gold_logprob_final compressed minus full",
    "lens_top1_layer": "first layer (1 … L) where the logit lens ranks the gold's first token top-1, else null",
    "lens_candidates": "[n_candidates][L] logit-lens log-prob of each candidate value's first in-context token per "
                       "layer, the gold first, then the instance's distractors (answer-identity probe input)",
    "lens_n_candidates": "number of candidates in lens_candidates (gold + distinguishable distractors)",
    "lens_candidates_dropped": "distractors left out because their first token equals a kept candidate's",
    "lens_identity_top1": "untrained identity readout: the gold's first token beats every distractor's at the last "
                          "layer (1, 1/k on a k-way tie, else 0); null with fewer than 2 candidates",
    "lens_candidates_seq": "[n_candidates][L] sequence lens: per layer, the log-likelihood of each candidate value's "
                           "whole in-context token sequence teacher-forced after the prompt under the cell's mask (the "
                           "final norm and unembedding applied to every layer's hidden states; last layer = the "
                           "model's own log-likelihood), the gold first, then every distinct distractor "
                           "(answer-identity probe input)",
    "lens_seq_n_candidates": "number of candidates in lens_candidates_seq (gold + every distinct distractor)",
    "lens_seq_identity_top1": "the model's own choice: the gold's whole-sequence log-likelihood (last layer) beats "
                              "every distractor's (1, 1/k on a k-way tie, else 0); null with fewer than 2 candidates",
    "lens_gold_seq_logprob_final": "log-likelihood of the gold's whole in-context token sequence after the prompt "
                                   "under the cell's mask (last layer of lens_candidates_seq)",
    "consensus_nosink_mean": "mean over layers of consensus_nosink",
    "rho_nosink_mean": "mean over layers of rho_nosink",
}

# Per-layer vectors (length L) -----------------------------------------------------------------------
LAYER_FIELDS: dict[str, str] = {
    "consensus_nosink": "Consensus(ℓ) at the last prompt token = distinct argmax keys / query heads, argmax over "
                        "the keys after the first n_sink (attention-sink) positions; the default every analysis reads",
    "rho_nosink": "agreement fraction ρ_ℓ = largest share of query heads sharing one argmax key, sinks excluded",
    "consensus_group_nosink": "GQA-aware Consensus(ℓ): each KV group's head-averaged attention, its argmax after the "
                              "first n_sink positions; distinct argmaxes / KV groups (equals consensus_nosink at one "
                              "query head per group; the value comparable across models with different group sizes)",
    "rho_group_nosink": "GQA-aware ρ_ℓ: largest share of KV groups sharing one argmax key, sinks excluded",
    "consensus_withsink": "Consensus(ℓ) with argmax over every key, attention sinks included (reference only)",
    "rho_withsink": "ρ_ℓ with argmax over every key, attention sinks included (reference only)",
    "evidence_mass_layer": "attention mass onto T_ev from the last prompt token per layer (mean over heads)",
    "evidence_mass_layer_full": "evidence_mass_layer with the full (uncompressed) cache",
    "ger_layer": "GER per layer: share of answer tokens evicted from every KV head of that layer",
    "hidden_cosine": "cosine of compressed vs full last-prompt-token hidden state per layer",
    "lens_gold_logprob": "logit lens per layer ℓ = 1 … L at the last prompt token: log-softmax of "
                         "unembed(final_norm(h_ℓ)) at the gold answer's first in-context token (last layer: the "
                         "model's logits)",
    "lens_gold_rank": "rank of the gold's first token under the logit lens per layer (0 = top-1)",
}

#: fields renamed since earlier stores: old name -> new name (the analysis loader maps them). The old
#: ``consensus``/``rho`` were the with-sink vectors; the old ``*_mean`` were already sink-free.
RENAMED_FIELDS: dict[str, str] = {
    "consensus": "consensus_withsink",
    "rho": "rho_withsink",
    "consensus_mean": "consensus_nosink_mean",
    "rho_mean": "rho_nosink_mean",
}

ALL_FIELDS: dict[str, str] = {**KEY_FIELDS, **TASK_FIELDS, **PRESS_FIELDS, **STATUS_FIELDS, **TIMING_FIELDS,
                               **METRIC_FIELDS, **LAYER_FIELDS}
