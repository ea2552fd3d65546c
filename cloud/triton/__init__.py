"""Triton Inference Server: the model repository the cloud's models are served from."""
