"""``model.chat_template``: a chat template in place of the tokenizer's own, given by name, file or text.

The tokenizer renders the prompts (``data.apply_chat_template``), an agent loop's turns and the exported model's
conversations with it, so it is set where the tokenizer is loaded (:func:`rlplat.models.tokenizer.load_tokenizer`),
and every process that loads the tokenizer (the controller, the workers, the export) renders alike.

The named templates write the well-known formats; their Jinja here is rlplat's own:

* ``chatml``: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message (Qwen's, OpenAI's ChatML);
* ``tulu``: ``<|{role}|>\\n{content}\\n`` per message, the end-of-sequence token after each assistant message
  (the Tulu models' format; open-instruct's ``--chat_template_name tulu``);
* ``zephyr``: ``<|{role}|>\\n{content}{eos}\\n`` per message (the Zephyr models' format).

Each ends with the assistant's header when a generation prompt is asked for.
"""

from __future__ import annotations

from pathlib import Path

from rlplat.config.errors import ConfigError

_ADD_GENERATION = "{% if add_generation_prompt %}"
NAMED_TEMPLATES = {
    "chatml": ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
               "{% endfor %}" + _ADD_GENERATION + "<|im_start|>assistant\n{% endif %}"),
    "tulu": ("{% for message in messages %}<|{{ message['role'] }}|>\n{% if message['role'] == 'assistant' %}"
             "{{ message['content'] }}{{ eos_token }}\n{% else %}{{ message['content'] }}\n{% endif %}{% endfor %}"
             + _ADD_GENERATION + "<|assistant|>\n{% endif %}"),
    "zephyr": ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
               "{% endfor %}" + _ADD_GENERATION + "<|assistant|>\n{% endif %}"),
}


def resolve_chat_template(value: str) -> str:
    """The Jinja text ``model.chat_template`` stands for: a name of :data:`NAMED_TEMPLATES`, a file holding a
    template, or a template itself (it has ``{%`` or ``{{``); anything else is a :class:`ConfigError`."""
    if value in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[value]
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        text = path.read_text()
        if "{%" not in text and "{{" not in text:
            raise ConfigError(f"model.chat_template={value}: the file holds no Jinja template (no {{% or {{{{)")
        return text
    raise ConfigError(f"model.chat_template={value!r}: not a named template ({', '.join(NAMED_TEMPLATES)}), not a "
                      f"file, and not a Jinja template itself (no {{% or {{{{)")
