"""Model engines used by agents: llama.cpp (GGUF, devices) and PyTorch (HF folders, server)."""
