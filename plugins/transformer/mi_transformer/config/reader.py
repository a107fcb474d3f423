"""Strict, typed access to ``config.json`` (:class:`ConfigReader`) and the error for keys
no parser reads (:class:`UnknownKeysError`)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from mi_core.plugin import ConfigError, ConfigFields, REQUIRED

_REQUIRED: Any = REQUIRED


class ConfigReader(ConfigFields):
    """Typed access to one config dict; remembers every key it was asked for.

    No coercion: an int field takes a JSON integer (not a bool, not 2.0), a float field a
    finite JSON number, a bool field ``true``/``false``. A JSON ``null`` is the default.
    The core :class:`~mi_core.configread.ConfigFields` with the transformer's method names
    and message wording (``{src}: {key} = {value!r} ({type}): expected ...``).
    """

    def __init__(self, cfg: Any, src: str) -> None:
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{src}: expected a JSON object, got {type(cfg).__name__}")
        bad = [k for k in cfg if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{src}: keys must be strings, got {bad[:5]}")
        super().__init__(cfg, src, error=ConfigError)
        self.src = src

    def bad(self, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{self.src}: {key} = {value!r} ({type(value).__name__}): "
                           f"expected {expected}")

    def type_error(self, key: str, value: Any, expected: str) -> ConfigError:
        return self.bad(key, value, "a finite number" if expected == "a number" else expected)

    def min_error(self, key: str, value: Any, minimum: Any) -> ConfigError:
        return self.bad(key, value, f"an integer >= {minimum}")

    def number_error(self, key: str, value: Any, broken: Any, bounds: Any) -> ConfigError:
        if broken is None:
            return self.bad(key, value, "a finite number")
        return self.bad(key, value, f"a number {broken[0]} {broken[1]}")

    def choice_error(self, key: str, value: Any, choices: Iterable[str]) -> ConfigError:
        return self.bad(key, value, f"one of {sorted(choices)}")

    def int(self, key: str, default: Any = _REQUIRED, *, min: int | None = 1) -> Any:
        return self.integer(key, default, min)

    def float(self, key: str, default: Any = _REQUIRED, *, gt: float | None = None,
              ge: float | None = None, le: float | None = None) -> Any:
        return self.number(key, default, gt=gt, ge=ge, le=le)

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.flag(key, default)

    def str(self, key: str, default: Any = _REQUIRED, choices: Iterable[str] | None = None
            ) -> Any:
        return self.text(key, default, choices)

    def list(self, key: str) -> Any:
        return self.sequence(key)

    def refuse_unless(self, key: str, allowed: Any, why: str) -> None:
        """A key whose other values change the numbers in a way not implemented."""
        v = self.get(key)
        if v is not None and v != allowed:
            raise ConfigError(f"{self.src}: {key} = {v!r} is not supported ({why}); only "
                              f"{allowed!r} is")

    def sub(self, key: str, value: Mapping[str, Any]) -> "ConfigReader":
        return ConfigReader(value, f"{self.src} [{key}]")


class UnknownKeysError(ConfigError):
    """A config holds keys that may change the numbers and that no parser implements."""

    def __init__(self, message: str, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys
