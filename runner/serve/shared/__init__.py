"""What every API of the server does the same way, so that each API's package only maps its own shapes:
the request's body read within bounds and its model named (body), the fields the APIs share (fields),
messages, text parts, system texts, tools and tool calls as the engine's `Ask` takes them (translate),
errors and the access line (http), an answer whole or streamed (answers), embeddings (embeddings).

The API packages (openai, ollama, anthropic, responses) import this and never each other.
"""
