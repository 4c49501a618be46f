"""One module per command: orchestration only (parse nothing, compute little, print the answer).

May import the loader and everything below it; never the CLI, never another command.
"""
