"""Models by name: references, the catalog, quant choice, the Hub and its mirrors, verified
downloads, the cache, and a model's GGUF headers read without downloading it.

May import gguf, errors, paths, limits and ui; never engine/, memory/, the loader or a command.
"""
