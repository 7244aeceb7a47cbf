"""A TypedDict as the schema that results.check validates (a JSON Schema subset: type, required, properties,
items, additionalProperties, enum, pattern, maxLength), so that document.py's types are the document's one
definition and the validator is derived from them.

- str, int, float, bool: string, integer, number (finite, an int too), boolean; Any: anything;
- X | None: X or null; Literal[...]: enum; list[X]: array of X; dict[str, X]: an object of X (dict[str, Any]:
  any object);
- a TypedDict: an object with its required keys (NotRequired ones may be missing), extra keys allowed;
- Annotated[X, Rule(pattern=...)]: X with the rule's constraints."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)


@dataclass(frozen=True)
class Rule:
    """What a value must be beyond its type (Annotated metadata must be hashable: no plain dict)."""
    pattern: str | None = None  # the whole string matches
    max_length: int | None = None

    def schema(self) -> dict:
        rules = {"pattern": self.pattern, "maxLength": self.max_length}
        return {key: value for key, value in rules.items() if value is not None}


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def schema_of(shape: Any) -> dict:
    if shape is Any:
        return {}
    if is_typeddict(shape):
        return _object(shape)
    origin, args = get_origin(shape), get_args(shape)
    if origin in (NotRequired, Required):
        return schema_of(args[0])
    if origin is Annotated:
        out = schema_of(args[0])
        for rule in shape.__metadata__:
            if isinstance(rule, Rule):
                out.update(rule.schema())
        return out
    if origin in (Union, types.UnionType):
        return _nullable(shape, args)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list:
        return {"type": "array", "items": schema_of(args[0])}
    if origin is dict:
        return {"type": "object"} if args[1] is Any else {"type": "object", "additionalProperties": schema_of(args[1])}
    if shape in _SIMPLE:
        return {"type": _SIMPLE[shape]}
    raise TypeError(f"typed_schema: no schema for {shape!r}")


def _object(shape: Any) -> dict:
    hints = get_type_hints(shape, include_extras=True)
    return {"type": "object", "required": [key for key in hints if key in shape.__required_keys__],
            "properties": {key: schema_of(hint) for key, hint in hints.items()}}


def _nullable(shape: Any, args: tuple) -> dict:
    """X | None; a union of anything else has no schema here."""
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) != 1 or len(kinds) == len(args):
        raise TypeError(f"typed_schema: only X | None is a union with a schema, not {shape!r}")
    out = schema_of(kinds[0])
    if "enum" in out:
        return {**out, "enum": [*out["enum"], None]}
    kind = out["type"]
    return {**out, "type": [*(kind if isinstance(kind, list) else [kind]), "null"]}
