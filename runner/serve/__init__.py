"""`runner serve`: the models on this machine behind the OpenAI, Ollama and Anthropic HTTP APIs.

engine_backend.py is each model's engine thread (the batch loop every request joins), backend.py what
the HTTP side sees of it. The HTTP side (app.py over apis.py, one package per API over shared/) never
calls llama.cpp. Imported only by `serve`.
"""
