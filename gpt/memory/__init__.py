"""How large a micro-batch fits one GPU: planned from bytes per token, probed by real steps, measured by gpt-plan --measure."""
