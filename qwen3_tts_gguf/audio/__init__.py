"""Audio out: the s16 rule, streaming encoders (PyAV, G.711), speed, the file writer."""
