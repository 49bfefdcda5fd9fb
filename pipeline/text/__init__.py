"""Text policy between the LLM and the voice: detokenizing, clauses, what is spoken."""
