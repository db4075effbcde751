"""Megatron-Core training engine (``engine.py``), its ``GPTModel`` (``model.py``) and the Hugging Face <->
Megatron weight conversion with tensor-parallel sharding (``convert.py``). See docs/megatron.md."""
