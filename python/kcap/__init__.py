"""kcap: quantized GGUF language models on Apple Metal, NVIDIA CUDA and the CPU."""
