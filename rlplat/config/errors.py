"""The one exception type of configuration problems (imported by every config module, importing none)."""


class ConfigError(ValueError):
    """A configuration problem; the message names the full key path and what was expected."""
