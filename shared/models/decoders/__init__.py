"""Pure output decoders: numpy in, boxes/labels/text out. No model or session here."""
