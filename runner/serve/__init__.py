"""`runner serve`: the models on this machine behind the OpenAI and Ollama HTTP APIs.

backend.py is the one engine thread (the batch loop every request joins) and what the HTTP side sees
of it; the HTTP side (app.py and one module per API) never calls llama.cpp. Imported only by `serve`.
"""
