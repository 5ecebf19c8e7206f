"""API and form schemas, declared once: validation and the OpenAPI document both read them.

Each field carries its type, bounds and a description (the TrueNAS habit); a
value outside them is refused with a message naming the field, the value and
what was expected. HTML forms send strings, so ``from_form`` converts them
(an unchecked checkbox is False) before the same checks run."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.units import format_duration, parse_duration

TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


class ValidationError(ValueError):
    """Bad input: ``errors`` maps each field name (or "" for the whole form) to a message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(errors.values()))


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
    # "duration": an integer of seconds that forms show and take as "30 d" (engine.units)
    unit: str | None = None

    def clean(self, value: Any) -> Any:
        """The value if it fits, else ValueError naming the field, the value
        and what was expected."""

        def bad(expected: str):
            shown = (
                repr(value)
                if not isinstance(value, str) or len(value) <= 60
                else repr(value[:60]) + "..."
            )
            return ValueError(f"{self.name} = {shown}: expected {expected}")

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
            raise bad(self.description[0].lower() + self.description[1:])
        if self.check is not None:
            value = self.check(value)  # its ValueError already names what failed
        return value

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
                    errors[f.name] = (
                        f"{f.name} is missing: expected "
                        f"{f.description[0].lower() + f.description[1:]}"
                    )
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
