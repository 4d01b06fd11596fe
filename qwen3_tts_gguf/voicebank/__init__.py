"""Voices: the profile store, cloning from reference audio, design-then-clone."""
