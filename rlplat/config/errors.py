"""The one exception type of configuration problems and its check (imported by every config module, importing none)."""


class ConfigError(ValueError):
    """A configuration problem; the message names the full key path and what was expected."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)
