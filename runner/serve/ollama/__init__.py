"""The Ollama API: /api/chat, /api/generate (with Ollama's load and unload), /api/embed, /api/embeddings,
/api/tags, /api/show, /api/ps and /api/version, so that Ollama's clients work by pointing OLLAMA_HOST at
runner; its model management (pull, push, create, copy, delete) refused, naming runner's command.

protocol.py the request models, serving.py the translation to the engine's Ask and back (answers,
NDJSON streams, model descriptions), embed.py the embeddings, routes.py the routes, errors.py how this
API says an error.
"""
