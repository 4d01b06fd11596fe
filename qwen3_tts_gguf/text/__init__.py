"""Text before it is spoken: segments, live text feeds, normalization."""
