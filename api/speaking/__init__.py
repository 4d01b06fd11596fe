"""One path into the engine for every protocol: the plan, the HTTP body, the socket utterance, progress, alignment,
usage, warm-up."""
