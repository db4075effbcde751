"""Megatron-Core support: Hugging Face <-> Megatron ``GPTModel`` weight conversion with tensor-parallel
sharding (:mod:`rlplat.engines.megatron.convert`), the base of the ``megatron`` training engine."""
