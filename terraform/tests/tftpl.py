"""Renders Terraform `templatefile` templates in Python, for the subset the felix-cluster
module's templates use, so the tests can check what an instance would receive without
Terraform (which cannot be installed here).

Supported, with Terraform's semantics:
  * literal text, with `$${` and `%%{` escapes;
  * `${ name }` and `${ name.attr }`: a string, number or bool variable (or attribute);
  * `%{ if name }`, `%{ if !name }`, `%{ else }`, `%{ endif }` on a bool;
  * `%{ for x in list }` / `%{ for k, v in list_or_map }` ... `%{ endfor }`;
  * strip markers `~` on either side of any `${...}` or `%{...}`: they remove all whitespace
    (newlines included) between the marker and the neighbouring text.

Anything else (function calls, operators, indexing, conditionals in `${}`) raises
`TemplateError`, as does a missing variable or a list interpolated as a string: a template
that outgrows this subset fails the tests loudly instead of being rendered wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(rf"^{_NAME}(\.{_NAME})*$")
_FOR = re.compile(rf"^for\s+({_NAME})(?:\s*,\s*({_NAME}))?\s+in\s+({_NAME}(?:\.{_NAME})*)$")
_IF = re.compile(rf"^if\s+(!?)\s*({_NAME}(?:\.{_NAME})*)$")


class TemplateError(Exception):
    """The template uses something this renderer does not implement, or a variable is
    missing or of the wrong kind."""


@dataclass
class _Text:
    text: str


@dataclass
class _Interp:
    ref: str


@dataclass
class _If:
    negate: bool
    ref: str
    then: list = field(default_factory=list)
    otherwise: list = field(default_factory=list)


@dataclass
class _For:
    key: str | None
    value: str
    ref: str
    body: list = field(default_factory=list)


def _tokens(src: str):
    """Yields ('text', str) and ('interp'|'directive', body, strip_left, strip_right)."""
    i = 0
    buf = []
    while i < len(src):
        two = src[i : i + 2]
        three = src[i : i + 3]
        if three in ("$${", "%%{"):
            buf.append(three[1:])
            i += 3
            continue
        if two in ("${", "%{"):
            end = src.find("}", i + 2)
            if end < 0:
                raise TemplateError(f"unclosed {two} at offset {i}")
            inner = src[i + 2 : end]
            if "{" in inner:
                raise TemplateError(f"nested braces are not supported: {two}{inner}}}")
            strip_left = inner.startswith("~")
            strip_right = inner.endswith("~")
            inner = inner[1 if strip_left else 0 : len(inner) - (1 if strip_right else 0)]
            yield ("text", "".join(buf))
            buf = []
            kind = "interp" if two == "${" else "directive"
            yield (kind, inner.strip(), strip_left, strip_right)
            i = end + 1
            continue
        buf.append(src[i])
        i += 1
    yield ("text", "".join(buf))


def _parse(src: str) -> list:
    # First apply strip markers to the neighbouring text tokens.
    toks = list(_tokens(src))
    for n, tok in enumerate(toks):
        if tok[0] == "text":
            continue
        _, _, left, right = tok
        if left and n > 0:
            toks[n - 1] = ("text", toks[n - 1][1].rstrip())
        if right and n + 1 < len(toks):
            toks[n + 1] = ("text", toks[n + 1][1].lstrip())

    root: list = []
    stack: list[tuple[object, list]] = [(None, root)]
    for tok in toks:
        out = stack[-1][1]
        if tok[0] == "text":
            if tok[1]:
                out.append(_Text(tok[1]))
            continue
        kind, body = tok[0], tok[1]
        if kind == "interp":
            if not _REF.match(body):
                raise TemplateError(f"unsupported expression ${{{body}}}: only variables and attributes")
            out.append(_Interp(body))
            continue
        if m := _FOR.match(body):
            key, value = (m.group(1), m.group(2)) if m.group(2) else (None, m.group(1))
            node = _For(key, value, m.group(3))
            out.append(node)
            stack.append((node, node.body))
        elif m := _IF.match(body):
            node = _If(m.group(1) == "!", m.group(2))
            out.append(node)
            stack.append((node, node.then))
        elif body == "else":
            node = stack[-1][0]
            if not isinstance(node, _If) or stack[-1][1] is node.otherwise:
                raise TemplateError("%{ else } outside an %{ if }")
            stack[-1] = (node, node.otherwise)
        elif body in ("endif", "endfor"):
            node = stack[-1][0]
            want = _If if body == "endif" else _For
            if not isinstance(node, want):
                raise TemplateError(f"%{{ {body} }} does not close the open directive")
            stack.pop()
        else:
            raise TemplateError(f"unsupported directive %{{{body}}}")
    if len(stack) != 1:
        raise TemplateError("unclosed %{ if } or %{ for }")
    return root


def _lookup(ref: str, scope: dict):
    parts = ref.split(".")
    if parts[0] not in scope:
        raise TemplateError(f"variable {parts[0]!r} is not defined")
    value = scope[parts[0]]
    for attr in parts[1:]:
        if not isinstance(value, dict) or attr not in value:
            raise TemplateError(f"{ref}: no attribute {attr!r}")
        value = value[attr]
    return value


def _string(value, ref: str) -> str:
    # Terraform's conversions of primitive values to strings.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value
    raise TemplateError(f"${{{ref}}} is a {type(value).__name__}, not a string, number or bool")


def _render(nodes: list, scope: dict) -> str:
    out = []
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Interp):
            out.append(_string(_lookup(node.ref, scope), node.ref))
        elif isinstance(node, _If):
            cond = _lookup(node.ref, scope)
            if not isinstance(cond, bool):
                raise TemplateError(f"%{{ if {node.ref} }}: not a bool")
            taken = node.then if cond != node.negate else node.otherwise
            out.append(_render(taken, scope))
        elif isinstance(node, _For):
            coll = _lookup(node.ref, scope)
            if isinstance(coll, dict):
                # Terraform iterates a map in lexical key order.
                items = sorted(coll.items())
            elif isinstance(coll, list):
                items = list(enumerate(coll))
            else:
                raise TemplateError(f"%{{ for ... in {node.ref} }}: not a list or map")
            for k, v in items:
                inner = dict(scope)
                inner[node.value] = v
                if node.key:
                    inner[node.key] = k
                out.append(_render(node.body, inner))
    return "".join(out)


def render(src: str, variables: dict) -> str:
    """Renders template text `src` as `templatefile` would with `variables`."""
    return _render(_parse(src), variables)


def render_file(path, variables: dict) -> str:
    with open(path, encoding="utf-8") as f:
        return render(f.read(), variables)
