"""Parser for the string form of a format.

Grammar (whitespace is free)::

    format     := "(" dim ("," dim)* ")" "->" "(" level ("," level)* ")"
    level      := expr ":" type
    expr       := dim | dim ("//" | "/") int | dim "%" int | dim ("+" | "-") dim
    type       := name [ "(" arg ("," arg)* ")" ]
    name       := dense | batch | compressed | loose_compressed | singleton | range | delta | structured
    arg        := int | unique | nonunique | ordered | unordered

``str(fmt)`` prints this form and ``TensorFormat.parse(str(fmt)) == fmt``. Errors name the
offending character and what was expected there.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch

from ..errors import FormatError, FormatParseError
from .expr import Dimension, LevelExpr
from .level import LevelFormat, LevelProperty, LevelType
from .tensor_format import TensorFormat

__all__ = ["parse_format"]

_TOKEN = re.compile(r"\s*(?:(->)|(//)|([^\W\d]\w*)|(\d+)|([(),:/%+\-]))")


#: the largest block constant (``i // c``, ``i % c``) a format may name
_MAX_CONSTANT = 2 ** 62


class _Tok(NamedTuple):
    kind: str  # "arrow", "op", "name", "int", "end"
    text: str
    offset: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            bad = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            raise FormatParseError(text, bad, f"unexpected character {text[bad]!r}")
        start = m.start(m.lastindex)
        kind = {1: "arrow", 2: "op", 3: "name", 4: "int", 5: "op"}[m.lastindex]
        toks.append(_Tok(kind, m.group(m.lastindex), start))
        pos = m.end()
    toks.append(_Tok("end", "", len(text.rstrip()) if text.strip() else len(text)))
    return toks


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def fail(self, expected: str, tok: _Tok | None = None) -> FormatParseError:
        tok = tok or self.peek()
        got = "end of text" if tok.kind == "end" else repr(tok.text)
        return FormatParseError(self.text, tok.offset, f"expected {expected}, got {got}")

    def take(self, text: str, expected: str | None = None) -> _Tok:
        tok = self.peek()
        if tok.text != text or tok.kind == "end":
            raise self.fail(expected or repr(text))
        self.i += 1
        return tok

    def take_kind(self, kind: str, expected: str) -> _Tok:
        tok = self.peek()
        if tok.kind != kind:
            raise self.fail(expected)
        self.i += 1
        return tok

    def parse(self) -> tuple[list[Dimension], list[tuple[LevelExpr, LevelType]]]:
        self.take("(", "'(' to open the dimension list, as in '(i, j) -> (...)'")
        dims: dict[str, Dimension] = {}
        while True:
            tok = self.take_kind("name", "a dimension name")
            if tok.text in dims:
                raise FormatParseError(self.text, tok.offset, f"dimension {tok.text!r} is declared twice")
            dims[tok.text] = Dimension(tok.text)
            if self.peek().text == ",":
                self.i += 1
                continue
            self.take(")", "',' or ')' in the dimension list")
            break
        self.take_kind("arrow", "'->' between the dimensions and the levels")
        self.take("(", "'(' to open the level list")
        levels: list[tuple[LevelExpr, LevelType]] = []
        while True:
            expr = self.expr(dims)
            self.take(":", "':' between a level expression and its level type")
            levels.append((expr, self.level_type()))
            if self.peek().text == ",":
                self.i += 1
                continue
            self.take(")", "',' or ')' in the level list")
            break
        if self.peek().kind != "end":
            raise self.fail("end of text")
        return list(dims.values()), levels

    def dim(self, dims: dict[str, Dimension]) -> Dimension:
        tok = self.take_kind("name", "a dimension name")
        if tok.text not in dims:
            raise FormatParseError(
                self.text, tok.offset, f"unknown dimension {tok.text!r}; declared: {', '.join(dims)}"
            )
        return dims[tok.text]

    def expr(self, dims: dict[str, Dimension]) -> LevelExpr:
        d = self.dim(dims)
        op = self.peek()
        if op.kind == "op" and op.text in ("//", "/", "%"):
            self.i += 1
            c = self.take_kind("int", f"a positive integer after {op.text!r}")
            if int(c.text) <= 0:
                raise FormatParseError(self.text, c.offset, f"the constant after {op.text!r} must be positive")
            if int(c.text) > _MAX_CONSTANT:
                # a block of more than 2^62 along a dimension addresses nothing an index dtype can hold
                # (the conversion failed with a bare OverflowError; session 21's sweep)
                raise FormatParseError(self.text, c.offset, f"the constant after {op.text!r} is {c.text}, past "
                                                            f"2^62: no index dtype holds such a block")
            return d % int(c.text) if op.text == "%" else d // int(c.text)
        if op.kind == "op" and op.text in ("+", "-"):
            self.i += 1
            other = self.dim(dims)
            return d + other if op.text == "+" else d - other
        return d

    def level_type(self) -> LevelType:
        tok = self.take_kind("name", "a level type (dense, batch, compressed, loose_compressed, singleton, range, delta(b), structured(n))")
        try:
            fmt = LevelFormat(tok.text.lower())
        except ValueError:
            names = ", ".join(f.value for f in LevelFormat)
            raise FormatParseError(self.text, tok.offset, f"unknown level type {tok.text!r}; known: {names}") from None
        param: int | None = None
        props: set[LevelProperty] = set()
        if self.peek().text == "(":
            self.i += 1
            while True:
                arg = self.peek()
                if arg.kind == "int":
                    if param is not None or not fmt.takes_parameter:
                        raise FormatParseError(self.text, arg.offset, f"{fmt.value} takes no (further) integer argument")
                    param = int(arg.text)
                elif arg.kind == "name" and arg.text.lower() in {p.value for p in LevelProperty}:
                    props.add(LevelProperty(arg.text.lower()))
                else:
                    raise self.fail("an integer or a property (unique, nonunique, ordered, unordered)")
                self.i += 1
                if self.peek().text == ",":
                    self.i += 1
                    continue
                self.take(")", "',' or ')' after a level argument")
                break
        if fmt.takes_parameter and param is None:
            raise FormatParseError(self.text, tok.offset, f"{fmt.value} needs an integer argument, e.g. {fmt.value}(4)")
        spec = (fmt, *(() if param is None else (param,)), *sorted(props, key=lambda p: p.value))
        try:
            from .level import as_level_type

            return as_level_type(spec)
        except FormatError as err:
            raise FormatParseError(self.text, tok.offset, str(err)) from None


def parse_format(text: str, *, index_dtype: torch.dtype | str | None = None, name: str | None = None) -> TensorFormat:
    if not isinstance(text, str):
        raise FormatError(f"a format string is expected, got {type(text).__name__}")
    dims, levels = _Parser(text).parse()
    return TensorFormat(dims, levels, index_dtype=index_dtype, name=name)
