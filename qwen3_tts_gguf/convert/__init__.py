"""Conversion of official Hugging Face checkpoints into model folders (no PyTorch)."""
