"""What llama.cpp will allocate, and whether it fits: the estimate, ggml's allocator replayed over
llama.cpp's graphs, this machine's devices, and the plan.

May import gguf, errors, limits and ui; never engine/, hub/, the loader or a command. What it needs
of the engine (the build's facts, a dry run of a load) the loader passes in.
"""
