"""Harnesses for rlplat's client loop (``rollout.agent.name=client rollout.agent.harness=<file>:<function>``;
docs/environments.md): async functions that hold one conversation through an OpenAI client and return
reward terms. rlplat answers the client with its rollout engine and trains on the conversation token for
token.

``again``: the model answers a sum; a wrong answer is told "no, again:" once (the protocol of the
``multi`` environment of verifiers_arithmetic.py, written against a client instead).
``verifiers_rollout``: verifiers' own rollout loop of that file's ``multi`` environment, through the client.
"""

import functools


async def again(client, row) -> dict:
    messages, answer = list(row["prompt"]), row["reward_model"]["ground_truth"]
    for turn in range(2):
        reply = await client.chat.completions.create(model="rlplat", messages=messages)
        text = reply.choices[0].message.content or ""
        if text.strip() == answer or turn == 1 or reply.choices[0].finish_reason == "length":
            return {"correct": float(text.strip() == answer)}
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "no, again:"}]


@functools.cache
def _environment():
    import verifiers_arithmetic  # beside this file

    return verifiers_arithmetic.load_environment(kind="multi")


async def verifiers_rollout(client, row) -> dict:
    import json
    import sys
    from pathlib import Path

    import verifiers as vf

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    env = _environment()
    task = {**json.loads(row["extra_info"]["verifiers_row"]), "prompt": row["prompt"]}
    state = await env.rollout(task, vf.OpenAIChatCompletionsClient(client), "rlplat", {})
    await env.rubric.score_group([state])
    return {"correct": float(state["reward"])}
