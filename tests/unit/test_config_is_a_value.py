"""A config is a value: outside the recipe (``dmlkit/recipe/``) and config loading (``dmlkit/config/``) no module
writes to a config's fields; new configs are built with ``dataclasses.replace`` or ``config_from_dict``.

The scan reads every module's syntax tree and follows types, not variable names. An object is a config when
it is annotated with a config class (a parameter ``c: RunConfig``, ``m: ModelConfig | None = ...``), made by a
config-returning call (``load_config``, ``config_from_dict``, ``load_run_config``, a config class, or
``replace`` of a config), bound to a section of one (``m = anything.model``: the names of ``RunConfig``'s
sections), or named like one (``cfg``, ``config``, ``fold_cfg``). A write is an assignment (plain, augmented,
annotated, tuple) or ``setattr`` whose target's object is a config, or whose target ends in a section and
one of that section's fields, whatever the object before it is called (``saved.model.pretrained = ...``).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

from dmlkit.config import schema

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dmlkit"
OWNERS = ("recipe", "config")  # the packages that may fill in a config

CONFIG_NAME = re.compile(r"^(cfg|config|\w+_cfg|\w+_config)$")
#: Every config dataclass of the schema, by name, and the fields of each.
CONFIG_CLASSES = {name: cls for name, cls in vars(schema).items()
                  if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == schema.__name__}
FIELDS = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in CONFIG_CLASSES.items()}
#: ``RunConfig``'s sections: attribute name -> section class name (``model`` -> ``ModelConfig``).
SECTIONS = {name: tp.__name__ for name, tp in typing.get_type_hints(schema.RunConfig).items()
            if isinstance(tp, type) and tp.__name__ in CONFIG_CLASSES}
MAKERS = {"load_config", "config_from_dict", "load_run_config", *CONFIG_CLASSES}


def _chain(node: ast.AST) -> list[str]:
    """``a.b.c`` as ``["a", "b", "c"]`` (empty for anything else)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else []


def _annotated_class(annotation: ast.AST | None) -> str | None:
    """The config class an annotation names (``RunConfig``, ``"RunConfig | None"``, ``Optional[ModelConfig]``)."""
    if annotation is None:
        return None
    text = annotation.value if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str) \
        else ast.unparse(annotation)
    return next((name for name in CONFIG_CLASSES if re.search(rf"\b{name}\b", text)), None)


class _Types:
    """What is known of the names of one scope: name -> (config class name, certain). A section reached through an
    object of unknown type (``x.model``) is uncertain: only its own fields count as a config's."""

    def __init__(self, known: dict[str, str]):
        self.known = {name: (cls, True) for name, cls in known.items()}

    def of_chain(self, chain: list[str]) -> tuple[str, bool] | None:
        """The config class ``chain`` evaluates to, and whether that is certain, when it may be one."""
        if not chain:
            return None
        current = self.known.get(chain[0]) or (("RunConfig", True) if CONFIG_NAME.match(chain[0]) else None)
        for name in chain[1:]:
            if current is not None and current[1] and name in SECTIONS and name in FIELDS[current[0]]:
                current = (SECTIONS[name], True)
            elif name in SECTIONS:  # x.model: a section by its name, whatever x is
                current = (SECTIONS[name], False)
            elif CONFIG_NAME.match(name):  # self.cfg
                current = ("RunConfig", True)
            else:
                current = None
        return current

    def of_value(self, value: ast.AST) -> tuple[str, bool] | None:
        """The config class an expression makes, when it may be one."""
        if isinstance(value, ast.Call):
            func = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
            if func in CONFIG_CLASSES:
                return func, True
            if func in MAKERS:
                return "RunConfig", True
            if func == "replace" and value.args:
                return self.of_value(value.args[0])
            return None
        return self.of_chain(_chain(value))


def _holds(owner: tuple[str, bool] | None, attribute: str) -> bool:
    """Whether ``attribute`` of an object of type ``owner`` is a config's field."""
    return owner is not None and (owner[1] or attribute in FIELDS[owner[0]])


def _written(types: _Types, target: ast.AST) -> bool:
    """Whether assigning to ``target`` writes a config's field."""
    chain = _chain(target)
    return len(chain) > 1 and _holds(types.of_chain(chain[:-1]), chain[-1])


def _scopes(tree: ast.Module):
    """The module and every function, each with the config classes its parameters are annotated with."""
    yield tree, {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            yield node, {a.arg: c for a in params if a is not None and (c := _annotated_class(a.annotation))}


def config_writes(source: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every write to a config's field in ``source``."""
    found = []
    for scope, params in _scopes(ast.parse(source)):
        types = _Types(params)
        nodes = list(ast.walk(scope))
        for _ in range(2):  # bindings in any order: an alias made after its use in a loop body
            for node in nodes:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    annotated = _annotated_class(node.annotation)
                    made = (annotated, True) if annotated else types.of_value(node.value) if node.value else None
                    if made:
                        types.known[node.target.id] = made
                elif isinstance(node, ast.Assign):
                    made = types.of_value(node.value)
                    if made:
                        types.known.update({t.id: made for t in node.targets if isinstance(t, ast.Name)})
        for node in nodes:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            found += [(node.lineno, ".".join(_chain(t))) for t in flat if _written(types, t)]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and node.args:
                obj = node.args[0]
                if isinstance(obj, ast.Call) and getattr(obj.func, "id", "") == "getattr" and len(obj.args) > 1 \
                        and isinstance(obj.args[1], ast.Constant):  # getattr(cfg, "model")
                    owner = types.of_value(obj.args[0])
                    obj_type = (SECTIONS.get(obj.args[1].value, ""), True) if _holds(owner, obj.args[1].value) else None
                else:
                    obj_type = types.of_value(obj)
                if obj_type is not None and (obj_type[1] or len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                                             and node.args[1].value in FIELDS.get(obj_type[0], ())):
                    found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def test_no_module_outside_the_recipe_and_config_loading_writes_a_config():
    writes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in OWNERS:
            continue
        writes += [f"{relative}:{line}: {target} = ..." for line, target in config_writes(path.read_text())]
    assert not writes, "config fields written outside dmlkit/recipe/ and dmlkit/config/:\n" + "\n".join(writes)


def test_the_scan_knows_every_section():
    assert {"data", "protocol", "model", "loss", "optimizer", "sampler", "train", "eval", "asap"} <= set(SECTIONS)
    assert "pretrained" in FIELDS["ModelConfig"] and "max_steps" in FIELDS["TrainConfig"]


def test_the_scan_sees_each_kind_of_write():
    source = (
        "def f(cfg, fold_cfg, other):\n"
        "    cfg.train.max_steps = 3\n"
        "    fold_cfg.seed = 1\n"
        "    t = cfg.train\n"
        "    t.eval_every = 2\n"
        "    self.cfg.name, x = 'a', 1\n"
        "    setattr(getattr(cfg, 'model'), 'name', 'x')\n"
        "    other.value = 4\n"  # not a config
        "    self.cfg = cfg\n"  # holding a config is not writing one
    )
    assert [line for line, _ in config_writes(source)] == [2, 3, 5, 6, 7]


def test_the_scan_follows_types_not_names():
    source = (
        "def f(run: RunConfig, section: 'ModelConfig | None', folder):\n"
        "    saved = load_config(path=folder)\n"
        "    saved.model.pretrained = False\n"  # a section's field, whatever the variable is called
        "    saved.seed = 3\n"  # made by load_config
        "    run.name = 'x'\n"  # annotated
        "    section.weights = None\n"
        "    m = saved.model\n"
        "    m.pretrained += 1\n"  # an alias of a section
        "    other = replace(run, seed=1)\n"
        "    other.seed = 2\n"  # replace of a config is a config
        "    anything.train.max_steps = 5\n"
        "    setattr(saved, 'seed', 4)\n"
        "    made = replace(saved, model=replace(saved.model, pretrained=False))\n"  # the right way: no write
        "    trainer.step = 3\n"  # not a config
        "    plan.model = built\n"  # an attribute named like a section, on something else
    )
    assert [line for line, _ in config_writes(source)] == [3, 4, 5, 6, 8, 10, 11, 12]


def test_a_run_and_its_sharing_write_no_config_field_whatever_holds_the_config(tiny_config, tmp_path, monkeypatch):
    """The scan's runtime twin: while a config run is planned, built, trained, shared and loaded back, every write to
    a field of any config object after its construction comes from the recipe or config loading, whatever the
    variable holding it is called; the finished config is as the plan left it."""
    import sys

    from dmlkit.config.schema import config_to_dict
    from dmlkit.engine.trainer import Trainer
    from dmlkit.recipe import prepare_run
    from dmlkit.sharing import load_shared, write_shared_folder

    owners = [PACKAGE.resolve() / owner for owner in OWNERS]
    writes: list[str] = []

    def recorded(self, name, value):
        frame = sys._getframe(1)
        where = Path(frame.f_code.co_filename).resolve()
        if frame.f_code.co_name != "__init__" and not any(where.is_relative_to(owner) for owner in owners):
            writes.append(f"{where.name}:{frame.f_lineno}: {type(self).__name__}.{name}")
        object.__setattr__(self, name, value)

    for cls in CONFIG_CLASSES.values():
        monkeypatch.setattr(cls, "__setattr__", recorded)
    resolved = prepare_run(tiny_config("train.max_steps=2"), echo=lambda _: None)
    finished = config_to_dict(resolved.cfg)
    Trainer(resolved, tmp_path / "run", echo=lambda _: None).fit()
    shared = write_shared_folder(tmp_path / "run", tmp_path / "shared", checkpoint="last")
    cfg, _ = load_shared(shared)
    assert writes == []
    assert config_to_dict(resolved.cfg) == finished and config_to_dict(cfg) == finished
