"""Compose the Hydra config from overrides, with errors that name the full key path.

``load_config(["algorithm=dapo", "rollout.n=16"])`` returns a read-only ``DictConfig`` that has passed
:func:`rlplat.config.validate.validate`. Every failure raises :class:`ConfigError` with one message:
unknown keys and group options get a did-you-mean, bad types name the key and the expected type.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlplat.config.derive import derive_batch_sizes, resolve_aliases
from rlplat.config.errors import ConfigError
from rlplat.config.imports import import_user_modules
from rlplat.config.migration import equivalent
from rlplat.config.schema import RLPlatConfig, register_schema
from rlplat.config.validate import validate

CONFIG_DIR = Path(__file__).resolve().parent
CONFIG_NAME = "trainer"
GROUPS = ("algorithm", "actor", "rollout")


def group_options(group: str) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")))


def _closest(word: str, candidates: typing.Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {prefix + close[0]!r}? " if close else ""


def _schema_fields(cls: type) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _free_form(cls: type, prefix: str = "") -> list[str]:
    out = []
    for name, tp in _schema_fields(cls).items():
        if typing.get_origin(tp) is dict:
            out.append(f"{prefix}{name}")
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.extend(_free_form(tp, f"{prefix}{name}."))
    return out


#: the schema's free-form sections (dict-typed: recipe, rollout.agent.environment_args)
FREE_FORM_KEYS = tuple(_free_form(RLPlatConfig))
FREE_FORM = tuple(f"{key}." for key in FREE_FORM_KEYS)  # as override prefixes


def check_key(path: str) -> None:
    """Raise ConfigError if the dotted ``path`` is not a key of the schema (list indices allowed)."""
    node: typing.Any = RLPlatConfig
    parts = path.split(".")
    for depth, part in enumerate(parts):
        if typing.get_origin(node) is dict:  # a free-form section (recipe.*): any key below it
            return
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            if part.isdigit():  # e.g. data.train_files.0
                continue
            parent = ".".join(parts[:depth])
            raise ConfigError(f"unknown config key {path!r}: {parent!r} is a value, not a section")
        fields = _schema_fields(node)
        if part not in fields:
            if known := equivalent(path):
                framework, hint = known
                raise ConfigError(f"unknown config key {path!r}: that is {framework}'s name; {hint} "
                                  f"(docs/migrating.md maps the others)")
            parent = ".".join(parts[:depth])
            where = f"under {parent!r}" if parent else "at the top level"
            suggestion = _closest(part, fields, prefix=f"{parent}." if parent else "")
            raise ConfigError(
                f"unknown config key {path!r}; {suggestion}known keys {where}: {', '.join(fields)}"
            )
        node = fields[part]


def check_overrides(overrides: list[str]) -> None:
    """Check every override's key (and group choice) against the schema before Hydra composes."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as err:
        raise ConfigError(f"cannot parse override: {err}") from None
    for override in parsed:
        key = override.key_or_group
        if key in GROUPS and not override.is_delete():
            value = override.value()
            options = group_options(key)
            if isinstance(value, str) and value not in options:
                raise ConfigError(
                    f"{key}={value!r} is not a preset; {_closest(value, options)}known: {', '.join(options)}"
                )
            continue
        check_key(key)


def _format_omegaconf_error(err: BaseException) -> str:
    full_key = getattr(err, "full_key", None)
    msg = (getattr(err, "msg", None) or str(err)).splitlines()[0]
    return f"{full_key}: {msg}" if full_key else msg


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the raw (unvalidated) config; errors are ConfigError with the key path."""
    # keys under a free-form section (recipe.*) are set or added alike (Hydra's "++"): no "+" needed
    overrides = [f"++{o}" if o.startswith(FREE_FORM) or o.partition("=")[0] in FREE_FORM_KEYS else o
                 for o in overrides or []]
    check_overrides(overrides)
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name=CONFIG_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        cause = err.__cause__ or err.__context__ or err
        if isinstance(cause, OmegaConfBaseException):
            raise ConfigError(_format_omegaconf_error(cause)) from None
        raise ConfigError(str(err).splitlines()[0]) from None


def _derive(cfg: DictConfig) -> None:
    resolve_aliases(cfg)
    try:
        derive_batch_sizes(cfg)
    except (TypeError, ZeroDivisionError):  # a non-positive size: validation names the key
        pass


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose, resolve interpolations, validate and freeze the config. The run's plan (what follows from
    it and from the chosen engines) is :func:`rlplat.workers.engine_setup.plan_run`'s."""
    cfg = compose_config(overrides)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise ConfigError(_format_omegaconf_error(err)) from None
    import_user_modules(cfg.trainer.imports)  # before validation: their plug-ins' names must count
    _derive(cfg)
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg
