"""The Ollama API: /api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps and
/api/version, so that Ollama's clients work by pointing OLLAMA_HOST at runner.

protocol.py the request models, serving.py the translation to the engine's Ask and back (answers,
NDJSON streams, model descriptions), embed.py the embeddings, routes.py the routes, errors.py how this
API says an error.
"""
