"""Command-line options derived from the config classes, so an option's default cannot drift from its field.

``EVAL.option("num_envs")`` is a typer option whose default is ``EvalConfig.num_envs``'s default and
whose help is the comment beside that field (configs document their fields with one comment each).
The option remembers its field (``option.config_field``), and ``tests/cli/test_cli_defaults.py``
walks every command and checks each such option against the imported class.

Why the defaults and comments are read from the config's source file instead of its class: importing
``cosmos_robot_envs`` loads MuJoCo and gymnasium (about 0.6 s), ``cosmos_robot_server`` its transports,
``cosmos_robot.data.record`` the vector layer, and typer builds every command's options on any
invocation, so ``cosmos-robot --help`` and ``cosmos-robot version`` would pay for all of them. The
source is found without running any package ``__init__``; a default the reader cannot evaluate as a
literal (rare: a computed default) falls back to importing the class.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import operator
import sys
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

__all__ = [
    "EVAL",
    "RECORD",
    "SERVER",
    "ConfigClass",
    "FieldLink",
    "config_values",
    "policy_arg_option",
    "real_default",
    "split_tasks",
    "tasks_option",
]

_MISSING = object()
_FACTORIES: dict[str, Callable[[], Any]] = {"dict": dict, "list": list, "tuple": tuple, "set": set}
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Mult: operator.mul,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


@dataclass(frozen=True)
class FieldLink:
    """What an option stands for: ``owner.name``; ``to_config`` turns the option's value into the field's."""

    owner: ConfigClass
    name: str
    to_config: Callable[[Any], Any] | None = None

    def config_value(self, option_value: Any) -> Any:
        return self.to_config(option_value) if self.to_config is not None else option_value


@dataclass(frozen=True)
class ConfigClass:
    """A config dataclass named by module and class, read without importing it (see the module docstring)."""

    module: str
    name: str

    def load(self) -> type:
        cls: type = getattr(importlib.import_module(self.module), self.name)
        return cls

    def default(self, field: str) -> Any:
        value = _read(self.module, self.name).get(field, (_MISSING, ""))[0]
        return real_default(self.load(), field) if value is _MISSING else value

    def doc(self, field: str) -> str:
        return _read(self.module, self.name).get(field, (_MISSING, ""))[1]

    def option(
        self,
        field: str,
        *param_decls: str,
        help: str | None = None,
        from_config: Callable[[Any], Any] | None = None,
        to_config: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """A ``typer.Option`` for ``field``: its default (``from_config`` converts it to the option's
        form, ``to_config`` back), and its help from the field's comment unless ``help`` is given."""
        default = self.default(field)
        doc = help if help is not None else _sentence(self.doc(field))
        if not doc:
            raise ValueError(f"{self.name}.{field} has no comment to use as help; pass help=")
        info = typer.Option(from_config(default) if from_config else default, *param_decls, help=doc, **kwargs)
        info.config_field = FieldLink(self, field, to_config)
        return info


def split_tasks(text: str | None) -> tuple[str, ...]:
    """``--tasks reach,push`` -> ``("reach", "push")``; None or empty: every task of the suite."""
    return tuple(t.strip() for t in text.split(",") if t.strip()) if text else ()


def tasks_option(owner: ConfigClass) -> Any:
    """``--tasks a,b`` for a config's ``tasks`` tuple (task names or indices; empty: the whole suite)."""
    return owner.option(
        "tasks",
        help="Comma-separated task names or indices of the suite, e.g. 0,2-3 (default: all of them).",
        from_config=lambda names: ",".join(names) or None,
        to_config=split_tasks,
    )


def policy_arg_option(help: str) -> Any:
    """``--policy-arg / -a KEY=VALUE`` (repeatable); ``help`` continues "KEY=VALUE ..."."""
    return typer.Option(None, "--policy-arg", "-a", help=f"KEY=VALUE {help} (repeatable).")


def config_values(command: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """``{field: value}`` for each option of ``command`` derived with ``ConfigClass.option``, from the
    option values (``options``: the command's parameters by name) converted back with ``to_config``;
    the command then builds its config from these plus the fields it sets itself."""
    out: dict[str, Any] = {}
    for name, param in inspect.signature(command).parameters.items():
        link = getattr(param.default, "config_field", None)
        if isinstance(link, FieldLink):
            out[link.name] = link.config_value(options[name])
    return out


def real_default(cls: type, field: str) -> Any:
    """The default of ``cls.field`` from the class itself (dataclass or pydantic model)."""
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name == field:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
                raise ValueError(f"{cls.__name__}.{field} has no default")
        raise ValueError(f"{cls.__name__} has no field {field!r}")
    return cls.model_fields[field].get_default(call_default_factory=True)  # type: ignore[attr-defined]


def _sentence(comment: str) -> str:
    text = comment.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def _source_path(module: str) -> Path:
    """The file of ``module`` without running its packages' ``__init__`` (a top-level spec runs nothing)."""
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__file__", None):
        return Path(str(loaded.__file__))
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(module)
    base = Path(next(iter(spec.submodule_search_locations)))
    if not rest:
        return base / "__init__.py"
    path = base.joinpath(*rest[:-1], rest[-1] + ".py")
    return path if path.exists() else base.joinpath(*rest, "__init__.py")


@functools.cache
def _read(module: str, cls: str) -> dict[str, tuple[Any, str]]:
    """``{field: (default or _MISSING, comment)}`` of class ``cls`` in ``module``'s source."""
    try:
        source = _source_path(module).read_text()
    except (OSError, ModuleNotFoundError):
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    node = next((n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    out: dict[str, tuple[Any, str]] = {}
    for stmt in node.body if node is not None else []:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        default = _MISSING if stmt.value is None else _literal(stmt.value)
        end = stmt.end_lineno or stmt.lineno
        trailing = [comments[i] for i in range(stmt.lineno, end + 1) if i in comments]
        above: list[str] = []
        line = stmt.lineno - 1
        while line in comments and line not in code_lines:  # a comment block right above the field
            above.insert(0, comments[line])
            line -= 1
        out[stmt.target.id] = (default, trailing[0] if trailing else " ".join(above))
    return out


def _literal(node: ast.expr) -> Any:
    """A default written as a literal, arithmetic on literals, or ``field(default=...)`` /
    ``field(default_factory=dict)``; anything else is ``_MISSING`` (the class is imported instead)."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _literal(node.left), _literal(node.right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("field", "Field"):
        for kw in node.keywords:
            if kw.arg == "default":
                return _literal(kw.value)
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Name) and kw.value.id in _FACTORIES:
                return _FACTORIES[kw.value.id]()
    return _MISSING


EVAL = ConfigClass("cosmos_robot_envs.eval.config", "EvalConfig")
RECORD = ConfigClass("cosmos_robot.data.record", "RecordConfig")
SERVER = ConfigClass("cosmos_robot_server.config", "ServerConfig")
