"""Audio out: the s16 rule and formats, the streaming encoder (PyAV), G.711, the file writer."""
