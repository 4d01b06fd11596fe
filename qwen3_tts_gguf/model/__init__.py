"""A model folder opened for inference: manifest, prompt, tokenizer, sampler and the three stages (talker, code
predictor, codec) with their sessions."""
