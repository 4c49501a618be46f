"""The OpenAI API: /v1/chat/completions, /v1/completions, /v1/models and /v1/embeddings.

protocol.py the request models (shape and range, a 400 naming the field, as OpenAI's own API does),
serving.py the translation to the engine's Ask and back (answers, streams), embeddings.py the
embeddings, routes.py the routes, errors.py how this API says an error.
"""
