"""runner: a command-line local model runner for GGUF models on llama.cpp."""

__version__ = "0.1.0"
