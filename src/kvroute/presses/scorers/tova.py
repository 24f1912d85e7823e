from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress("tova", "TOVAPress", "Attention of the last prompt token, averaged over heads (TOVA, kvpress).")
