"""llama.cpp and nothing above it: the bindings, the generation loop, sampling, templates, prompts.

May import gguf, errors, limits and ui; never hub/, memory/, the loader or a command.
"""
