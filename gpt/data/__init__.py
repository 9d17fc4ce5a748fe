"""Tokens: the offline GPT-2 tokenizer, corpora made into llm.c-format shards, and the loaders that read them."""
