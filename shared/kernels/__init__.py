"""Native and CUDA kernels with a numpy reference."""
