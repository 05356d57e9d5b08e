"""Speculative decoding: cheap proposers (prompt lookup, a small draft model) guess the next tokens; the target
model checks all of them in one forward pass; rejection sampling keeps the output distribution exact."""
