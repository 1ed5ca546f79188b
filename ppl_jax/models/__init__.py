"""Model families that ppl_jax can build from an architecture description."""
