from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# Needs the full [H, T, T] prefill attention map (H2O-style accumulated attention): the only
# registered scorer whose memory grows quadratically with the context.
register_kvpress(
    "observed_attention", "ObservedAttentionPress",
    "Average attention each token receives during the prefill (H2O-style; needs the N×N map, kvpress).",
    needs_attentions=True,
)
