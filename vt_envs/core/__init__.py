"""The building blocks of every VT env: tools, tasks, parser, tokenizer, ToolEnv, vector env."""
