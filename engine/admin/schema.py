"""The fields of an admin object, declared once: the engine's checks, the REST API's request
and response schemas (OpenAPI) and the web UI's forms all read them.

Each field carries its type, bounds and a description (the TrueNAS habit); a value outside them
is refused with a message naming the field, the value and what was expected. Two ways to check:
- ``Schema.validate`` (REST bodies, forms): every bad field at once, as a ``ValidationError``
  mapping field -> message; HTML forms send strings, so ``from_form`` converts them first (an
  unchecked checkbox is False);
- ``Schema.check`` (the engine's services, hence also the CLI): the first bad field, raised as
  the domain's ``FieldError`` (an ``errors.InvalidArgument``) with ``field``, ``value`` and
  ``expected``, in the wording "a whole number 0-3650" that the CLI has always shown."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.base.errors import InvalidArgument
from engine.base.units import format_duration, parse_duration

TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


class ValidationError(ValueError):
    """Bad input: ``errors`` maps each field name (or "" for the whole form) to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(errors.values()))


def shown(value: Any) -> str:
    """A value as a message quotes it: repr, long strings cut at 60 characters."""
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:60]) + "..."
    return repr(value)


class FieldError(InvalidArgument, ValueError):
    """A field of an admin object has a value it cannot take (``Schema.check``); each domain
    subclasses it (engine.admin.exports.ExportValueError, engine.admin.smb.SmbValueError, ...)."""

    def __init__(self, field: str, value: object, expected: str):
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field} = {shown(value)}: expected {expected}")

    def __str__(self) -> str:  # the message alone, as a ValueError shows it (no "[Errno 22]")
        return self.strerror or ""


ErrorType = type[FieldError]  # named here: inside Field, ``type`` is a field's own


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # string | integer | number | boolean
    description: str
    required: bool = True
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    enum: tuple = ()
    pattern: str | None = None  # a full match, as in JSON Schema (anchored here)
    example: Any = None
    check: Callable[[Any], Any] | None = (
        None  # extra rule: returns the clean value or raises ValueError
    )
    # "duration": an integer of seconds that forms show and take as "30 d" (engine.base.units)
    unit: str | None = None

    def clean(self, value: Any) -> Any:  # noqa: C901 - one flat test per JSON Schema keyword
        """The value if it fits, else ValueError naming the field, the value
        and what was expected."""

        def bad(expected: str):
            return ValueError(f"{self.name} = {shown(value)}: expected {expected}")

        if self.type == "boolean":
            if not isinstance(value, bool):
                raise bad("true or false")
        elif self.type == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad("a whole number")
        elif self.type == "number":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad("a number")
        elif self.type == "string":
            if not isinstance(value, str):
                raise bad("a string")
        if self.minimum is not None and value < self.minimum:
            raise bad(f"at least {self.bound(self.minimum)}")
        if self.maximum is not None and value > self.maximum:
            raise bad(f"at most {self.bound(self.maximum)}")
        if self.min_length is not None and len(value) < self.min_length:
            raise bad(
                f"at least {self.min_length} characters"
                if self.min_length > 1
                else "a non-empty value"
            )
        if self.max_length is not None and len(value) > self.max_length:
            raise bad(f"at most {self.max_length} characters")
        if self.enum and value not in self.enum:
            raise bad(f"one of {', '.join(map(str, self.enum))}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise bad(self.lowered())
        if self.check is not None:
            value = self.check(value)  # its ValueError already names what failed
        return value

    def strict(self, value: Any, error: ErrorType, check: Callable | None = None) -> Any:
        """The clean value for the engine, else ``error`` naming what the field takes as a
        whole. ``check`` replaces the field's own (a rule that needs what the schema cannot
        hold, such as the namespace); a FieldError of another domain from it is re-raised
        as ``error``."""
        rule = check or self.check
        if rule is not None:
            try:
                return rule(value)
            except FieldError as exc:
                if isinstance(exc, error):
                    raise
                raise error(self.name, exc.value, exc.expected) from None
        if self.enum:
            if value not in self.enum:
                raise error(self.name, value, f"one of {', '.join(map(str, self.enum))}")
        elif self.type == "boolean":
            if not isinstance(value, bool):
                raise error(self.name, value, "true or false")
        elif self.type == "integer":
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or (self.minimum is not None and value < self.minimum)
                or (self.maximum is not None and value > self.maximum)
            ):
                raise error(self.name, value, f"a whole number {self.span()}")
        else:
            try:
                return self.clean(value)
            except ValueError:
                raise error(self.name, value, self.lowered()) from None
        return value

    def span(self) -> str:
        """'0-3650', '1 or more' or 'of any size': the bounds of a number."""
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"{low}-{high}"
        if low is not None:
            return f"{low} or more"
        return f"up to {high}" if high is not None else "of any size"

    def lowered(self) -> str:
        """The description as the end of "expected ..."."""
        return self.description[0].lower() + self.description[1:]

    def bound(self, limit: float) -> str:
        if self.unit == "duration":
            return f"{limit:g} s ({format_duration(limit)})"
        return f"{limit:g}"

    def from_form(self, text: str | None) -> Any:
        """An HTML form's string -> this field's type (None when absent or empty)."""
        if self.type == "boolean":
            return text is not None and text.lower() in ("on", "true", "1", "yes")
        if text is None or (text.strip() == "" and self.type != "string"):
            return None
        if self.unit == "duration":
            try:
                return round(parse_duration(text))
            except ValueError as exc:
                raise ValueError(f"{self.name} = {exc}") from None
        if self.type == "integer":
            try:
                return int(text.strip())
            except ValueError:
                raise ValueError(f"{self.name} = {text!r}: expected a whole number") from None
        if self.type == "number":
            try:
                return float(text.strip())
            except ValueError:
                raise ValueError(f"{self.name} = {text!r}: expected a number") from None
        return text

    def openapi(self) -> dict:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        for key, value in (
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("minLength", self.min_length),
            ("maxLength", self.max_length),
            ("default", self.default),
            ("example", self.example),
            ("pattern", f"^(?:{self.pattern})$" if self.pattern else None),
        ):
            if value is not None:
                out[key] = value
        if self.enum:
            out["enum"] = list(self.enum)
        if self.unit == "duration":
            out["format"] = "seconds"  # the API takes seconds; the web forms take "30 d"
        return out


@dataclass(frozen=True)
class Schema:
    name: str
    description: str
    fields: tuple[Field, ...] = field(default_factory=tuple)

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def defaults(self) -> dict[str, Any]:
        """What a new object gets for each field not given."""
        return {f.name: f.default for f in self.fields if f.default is not None}

    def check(
        self,
        values: Mapping[str, Any],
        *,
        error: type[FieldError],
        what: str,
        partial: bool = False,
        checks: Mapping[str, Callable[[Any], Any]] | None = None,
    ) -> dict:
        """The engine's check: the clean values given (``partial``: only those, as for an
        update; else the defaults fill what is missing), the first bad one raised as ``error``.
        ``what`` names the object ("an export"); ``checks`` replace fields' own rules with ones
        that need more than the value (the namespace, for a path)."""
        names = self.names()
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise error(unknown[0], values[unknown[0]], f"a field of {what}: {', '.join(names)}")
        given = dict(values) if partial else {**self.defaults(), **values}
        if partial and not given:
            raise error("fields", {}, f"some of {', '.join(names)}")
        rules = checks or {}
        clean: dict[str, Any] = {}
        for f in self.fields:
            if f.name in given:
                clean[f.name] = f.strict(given[f.name], error, rules.get(f.name))
            elif f.required and not partial:
                raise error(f.name, None, f.lowered())
        return clean

    def response(self, description: str, id_description: str, **extra: dict) -> dict:
        """The OpenAPI schema of the object as the API returns it: its id, every field (a
        response carries them all) and ``extra`` read-only properties."""
        properties: dict[str, dict] = {"id": {"type": "integer", "description": id_description}}
        for f in self.fields:
            properties[f.name] = {"type": f.type, "description": f.description}
            if f.enum:
                properties[f.name]["enum"] = list(f.enum)
        return {
            "type": "object",
            "description": description,
            "properties": {**properties, **extra},
            "required": ["id", *self.names()],
        }

    def validate(self, data: Any, *, partial: bool = False) -> dict:
        """Clean values of known fields; ``partial`` (PATCH) requires none and fills no defaults."""
        if not isinstance(data, Mapping):
            raise ValidationError(
                {
                    "": f"request body: expected a JSON object with fields "
                    f"{', '.join(f.name for f in self.fields)}"
                }
            )
        errors: dict[str, str] = {}
        known = {f.name for f in self.fields}
        for name in data:
            if name not in known:
                errors[name] = (
                    f"field {name!r} is unknown: expected some of {', '.join(sorted(known))}"
                )
        clean: dict[str, Any] = {}
        for f in self.fields:
            value = data.get(f.name)
            if value is None:
                if partial:
                    continue
                if f.default is not None:
                    clean[f.name] = f.default
                elif f.required:
                    errors[f.name] = f"{f.name} is missing: expected {f.lowered()}"
                continue
            try:
                clean[f.name] = f.clean(value)
            except ValueError as exc:
                errors[f.name] = str(exc)
        if partial and not clean and not errors:
            errors[""] = (
                f"no fields given: expected some of {', '.join(f.name for f in self.fields)}"
            )
        if errors:
            raise ValidationError(errors)
        return clean

    def from_form(self, form: Mapping[str, str | None], *, partial: bool = False) -> dict:
        raw: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for f in self.fields:
            if partial and f.name not in form and f.type != "boolean":
                continue
            try:
                value = f.from_form(form.get(f.name))
            except ValueError as exc:
                errors[f.name] = str(exc)
                continue
            if value is not None:
                raw[f.name] = value
        try:
            clean = self.validate(raw, partial=partial)
        except ValidationError as exc:
            exc.errors.update(errors)
            raise
        if errors:
            raise ValidationError(errors)
        return clean

    def openapi(self, *, partial: bool = False) -> dict:
        out = {
            "type": "object",
            "description": self.description,
            "additionalProperties": False,
            "properties": {f.name: f.openapi() for f in self.fields},
        }
        required = [f.name for f in self.fields if f.required and f.default is None]
        if required and not partial:
            out["required"] = required
        return out
