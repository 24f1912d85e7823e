from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress("keydiff", "KeyDiffPress", "Keep keys least similar to the mean key direction (KeyDiff, kvpress).")
