"""Thin HTTP routes: speech, listings, health, capabilities, voice profiles."""
