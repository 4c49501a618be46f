"""The OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, so that
`client.responses.create(...)` and the agents built on it work against runner.

protocol.py the request model, input.py its input items as the chat messages the templates read,
serving.py the request as the engine's Ask and the response's head, output.py the response object and
the stream events that build it, store.py where responses are kept (runner's conversation store),
routes.py the routes, errors.py how this API says an error (OpenAI's shape).
"""
