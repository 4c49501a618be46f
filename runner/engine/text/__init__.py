"""The engine's pure text: chat templates, reasoning styles, tool-call formats, constraints, the
schema walk and sampling settings. Nothing here imports llama.cpp (an import-linter contract says so),
so every edge can build and check a request without loading a model."""
