"""Model outputs made results: numpy in, boxes, labels and text out. No model or session here."""
