from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress("knorm", "KnormPress", "Keep keys with the smallest L2 norm (Knorm, kvpress).")
