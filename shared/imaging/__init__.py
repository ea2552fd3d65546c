"""Input adaptation: decode, colour, letterbox, normalise."""
