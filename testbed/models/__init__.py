"""The tiny model pair: tokenizer, configs, training, GGUF export, evaluation, cache, checks.

Heavy dependencies (torch, transformers, gguf, llama_cpp) are imported by the submodules that
need them, so importing this package is cheap.
"""
