"""The Anthropic Messages API: /v1/messages and /v1/messages/count_tokens, so that the `anthropic`
client and the agents built on it work by pointing their base URL at runner.

protocol.py the request models (content blocks, tools, tool_choice, thinking, output formats),
serving.py the translation to the engine's Ask and back (answers, events), routes.py the routes,
errors.py how this API says an error.
"""
