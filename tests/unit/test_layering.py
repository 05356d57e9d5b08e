"""The tree's layering, checked from the source (no imports run): no import cycles among hearth's modules, the
kernel package below everything that uses it, every HEARTH_* variable read in envs.py, and code comments that
explain instead of quoting measurements (those belong in commit messages and BENCHMARKS.md)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "hearth"


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks (imports there never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _function_lines(tree: ast.AST) -> set[int]:
    """Lines inside function bodies (imports there run when called, not when the module is imported)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _imports(name: str, lazy: bool) -> set[str]:
    """hearth modules `name` imports at import time, or (lazy) anywhere, inside functions too; never counting
    imports under TYPE_CHECKING."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree) | (set() if lazy else _function_lines(tree))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name and t != "hearth":  # (hearth/__init__ only re-exports, lazily)
                out.add(t)
    return out


GRAPH = {name: _imports(name, lazy=False) for name in MODULES}  # what importing each module runs
USES = {name: _imports(name, lazy=True) for name in MODULES}  # everything each module may import


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_among_hearth_modules() -> None:
    """Importing any module never comes back to itself. (A function-level import of a module that imports this one
    is allowed inside one layer, as the CLI's subcommands do; across layers the rules below forbid it.)"""
    assert _cycles() == []


def test_lower_layers_never_import_higher_ones() -> None:
    """kernels < weights < layers < models < engine: kernels imports only itself, envs and platform; weights nothing
    of layers, models, loader or engine; layers nothing of models, loader or engine."""
    rules = {
        "hearth.kernels": ("hearth.kernels", "hearth.envs", "hearth.platform"),
        "hearth.weights": ("hearth.kernels", "hearth.weights", "hearth.envs", "hearth.platform"),
    }
    forbidden = {"hearth.layers": ("hearth.models", "hearth.loader", "hearth.engine", "hearth.entrypoints")}
    bad = []
    for name, deps in USES.items():
        for pkg, allowed in rules.items():
            if name == pkg or name.startswith(pkg + "."):
                bad += [(name, d) for d in deps if not any(d == a or d.startswith(a + ".") for a in allowed)]
        for pkg, banned in forbidden.items():
            if name == pkg or name.startswith(pkg + "."):
                bad += [(name, d) for d in deps if any(d == b or d.startswith(b + ".") for b in banned)]
    assert bad == []


# Every package and top-level module, lowest first. A module imports (anywhere, lazily too) only from its own layer
# and the layers below it; inside the base layer, kernels is below the rest (the rule above).
LAYERS: list[tuple[str, ...]] = [
    ("hearth.errors", "hearth.envs", "hearth.platform", "hearth.platforms", "hearth.log_level", "hearth.heap",
     "hearth.kernels"),
    ("hearth.weights",),
    ("hearth.tokenizer", "hearth.structured", "hearth.sampling_params", "hearth.pooling_params", "hearth.detokenizer",
     "hearth.generation_defaults", "hearth.quantization_config", "hearth.vllm_compat", "hearth.arg_fields",
     "hearth.engine_args", "hearth.config", "hearth.kv_sizing", "hearth.metrics", "hearth.metrics_merge",
     "hearth.lora", "hearth.multimodal"),
    ("hearth.layers",),
    ("hearth.models",),
    ("hearth.loader",),
    ("hearth.distributed",),
    ("hearth.engine",),
    ("hearth.entrypoints", "hearth.ray", "hearth.benchmarks"),  # the doors
]


def _layer_of(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == top or module.startswith(top + ".") for top in layer):
            return i
    return None


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if m != "hearth" and _layer_of(m) is None] == []


def test_no_package_imports_a_higher_layer() -> None:
    upward = [(name, dep) for name, deps in USES.items() if name != "hearth"
              for dep in sorted(deps) if (_layer_of(dep) or 0) > (_layer_of(name) or 0)]
    assert upward == []


def _package_of(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _private_imports(name: str) -> list[tuple[int, str]]:
    """(line, what) of `from hearth.x import _name` reaching a private name outside its home: a module's private
    names are its own; a package's (its private submodules, its __init__'s private names) are its modules'."""
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hearth")
                and not node.level):
            continue
        is_package = node.module in MODULES and MODULES[node.module].name == "__init__.py"
        inside = name == node.module or name.startswith(node.module + ".")
        for a in node.names:
            if a.name.startswith("_") and not a.name.startswith("__") and not (is_package and inside):
                found.append((node.lineno, f"{node.module}.{a.name}"))
    return found


# Private attributes of other libraries that hearth reads on purpose (torch modules and tensors, argparse,
# namedtuples), and modules whose private classes it names (argparse's actions in type hints).
FOREIGN_PRIVATES = {"_parameters", "_buffers", "_version", "_replace", "_actions", "_action_groups", "_asdict",
                    "_fields"}
FOREIGN_MODULES = {"argparse"}


def _private_attribute_uses(name: str) -> list[tuple[int, str]]:
    """(line, attribute) of `obj._attr` where obj is not self / cls and this module defines no `_attr` itself: a
    private name of another module's class or module, used from outside it."""
    tree = ast.parse(MODULES[name].read_text())
    defined = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    own_package = _package_of(name).rpartition(".")[2]  # `kernels._x` inside hearth.kernels is the package's own
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", own_package,
                                                                                *FOREIGN_MODULES))
                and node.attr not in defined and node.attr not in FOREIGN_PRIVATES):
            found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    return found


def test_no_private_name_is_used_outside_its_module() -> None:
    """Private names (a leading underscore) stay home: a private module or module-level name is used by its own
    package only, a private attribute of a class only in the module that defines it."""
    bad = [f"{MODULES[name].relative_to(ROOT.parent)}:{line}: {what}" for name in sorted(MODULES)
           for line, what in _private_imports(name) + _private_attribute_uses(name)]
    assert bad == []


def _env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, variable) of every os.environ.get / os.getenv / os.environ[...] read of a HEARTH_* literal."""
    reads = []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and node.args:
            f = ast.unparse(node.func)
            if f in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ") \
                and isinstance(node.ctx, ast.Load):
            arg = node.slice
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("HEARTH_"):
            reads.append((node.lineno, arg.value))
    return reads


def test_every_hearth_variable_is_read_in_envs() -> None:
    outside = [(str(path.relative_to(ROOT.parent)), line, var) for name, path in MODULES.items()
               if name != "hearth.envs" for line, var in _env_reads(ast.parse(path.read_text()))]
    assert outside == []


def _import_time_env_reads(tree: ast.AST) -> list[int]:
    """Lines of `envs.<accessor>(...)` calls and os.environ reads that run when the module is imported (outside
    function bodies)."""
    inside = _function_lines(tree)
    lines = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in inside:
            continue
        if isinstance(node, ast.Call) and ast.unparse(node.func).startswith(("envs.", "os.environ.get", "os.getenv")):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            lines.append(node.lineno)
    return lines


def test_no_environment_variable_is_read_at_import() -> None:
    """envs.VARIABLES is read when a value is needed, never while a module is imported: a worker's environment,
    a test's setenv and `hearth doctor` all see the value that is in effect."""
    found = [(str(path.relative_to(ROOT.parent)), line) for name, path in MODULES.items()
             for line in _import_time_env_reads(ast.parse(path.read_text()))]
    assert found == []
    assert _import_time_env_reads(ast.parse("from hearth import envs\nX = envs.q6_tiles()\ndef f():\n"
                                            "    return envs.q6_tiles()\n")) == [2]


# A measurement in a comment: a number with a time / throughput unit, a speed-up ratio, or a machine name.
_UNIT = r"(?:ms|us|µs|ns|(?<= )s|sec|seconds|GB/s|GiB/s|MB/s|GF/s|GFLOP/s|GOP/s|TF/s|tok/s|tokens/s)"
TIMING = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?\s?(?:-\s?\d+(?:\.\d+)?\s?)?" + _UNIT + r"(?![\w/])"
                    r"|(?<![\w.])~?\d+(?:\.\d+)?x(?: (?:faster|slower|ahead|behind))?(?!\w)"
                    r"|\b\d+(?:\.\d+)?% (?:faster|slower)\b"
                    r"|\b(?:Zen ?\d|Skylake|EPYC|Sapphire Rapids|Ice Lake|\d-vCPU|\d-core)\b")


def _comment_lines(path: Path):
    """(line, text) of a file's comments and docstrings (C++: // and /* */ lines)."""
    src = path.read_text()
    if path.suffix == ".py":
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and node.body:
                    for i, line in enumerate(doc.split("\n")):
                        yield node.body[0].lineno + i, line
        return
    for i, line in enumerate(src.split("\n"), 1):
        j = line.find("//")
        if j >= 0:
            yield i, line[j:]
        elif line.strip().startswith(("/*", "*")):
            yield i, line


def test_no_code_comment_quotes_a_timing() -> None:
    hits = [f"{path.relative_to(ROOT.parent)}:{line}: {text.strip()}"
            for path in sorted(ROOT.rglob("*")) if path.suffix in (".py", ".cpp", ".h")
            for line, text in _comment_lines(path) if TIMING.search(text)]
    assert hits == []


def test_the_checks_see_what_they_look_for() -> None:
    """The checkers themselves: a cycle, a stray env read and a timing comment are each caught."""
    assert TIMING.search("# was 1.4 ms per call") and TIMING.search("// ~2.3x faster") \
        and TIMING.search("on the 2-vCPU Zen 5") and not TIMING.search("# rows [0, 32) of the 64-row panel")
    tree = ast.parse("import os\nx = os.environ.get('HEARTH_FOO', '1')\ny = os.environ['HEARTH_BAR']\n")
    assert [v for _, v in _env_reads(tree)] == ["HEARTH_FOO", "HEARTH_BAR"]
    saved = dict(GRAPH)
    try:
        GRAPH["hearth.envs"] = {"hearth.config"}
        GRAPH["hearth.config"] = GRAPH["hearth.config"] | {"hearth.envs"}
        assert any({"hearth.envs", "hearth.config"} <= set(c) for c in _cycles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_ctypes_signatures_are_declared_in_one_module() -> None:
    """Every kernel export's argtypes live in kernels/_signatures.py (one row per export)."""
    elsewhere = [str(path.relative_to(ROOT.parent)) for path in (ROOT / "kernels").rglob("*.py")
                 if path.name != "_signatures.py" and re.search(r"\.(argtypes|restype)\s*=", path.read_text())]
    assert elsewhere == []
