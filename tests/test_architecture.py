"""The house rules, held by the tree itself: no import circle, the engine reaches the server only at
the `serve` hand-off, rooms and modules of a readable size, and the HTTP contract unchanged.

Imports are read from the source (an AST walk over every `import` anywhere in a file, functions
included), never by running it.
"""

from __future__ import annotations

import ast
import json
import os
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("qwen3_tts_gguf", "api", "bench")
MAX_MODULES_PER_FOLDER = 16
MAX_MODULE_LINES = 800
SERVE_HAND_OFF = ("qwen3_tts_gguf/cli.py", "_add_serve_command")
"""The one function of the engine that imports `api`: `serve`'s flags and run belong to the server."""
NOT_SOURCE = (ROOT / "bench" / "cache",)
"""Git-ignored folders inside a package that hold others' code (the bench's peer engines' venvs)."""
OPENAPI = ROOT / "tests" / "data" / "openapi.json"
"""The OpenAPI document as served; rewrite it on purpose with QTTS_WRITE_OPENAPI=1 when the API changes."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(package: str, pattern: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob(pattern) if not any(p.is_relative_to(d) for d in NOT_SOURCE))


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in _sources(package, "*.py")}


def _imports(path: Path, modules: dict[str, Path]):
    """(imported module, the function it is imported in or None) for every import of a project module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for function, node in _walk(tree, None):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, function


def _walk(node: ast.AST, function: str | None):
    for child in ast.iter_child_nodes(node):
        yield function, child
        yield from _walk(child, child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function)


def test_no_import_circle_anywhere():
    modules = _modules()
    graph = {name: {target for target, _ in _imports(path, modules)} for name, path in modules.items()}
    # a package's __init__ importing its own modules is not a circle of ideas
    graph = {name: {t for t in targets if not name.startswith(t + ".") and not t.startswith(name + ".")
                    or not (modules[name].name == "__init__.py" or modules[t].name == "__init__.py")}
             for name, targets in graph.items()}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_engine_imports_the_server_only_at_the_serve_hand_off():
    modules = _modules()
    found = []
    for name, path in modules.items():
        if not name.startswith("qwen3_tts_gguf"):
            continue
        for target, function in _imports(path, modules):
            if target == "api" or target.startswith("api."):
                found.append((str(path.relative_to(ROOT)), function, target))
    assert found and all((where, function) == SERVE_HAND_OFF for where, function, _ in found), found


def test_every_room_is_small_enough_and_says_what_it_holds():
    for package in PACKAGES:
        for folder in [ROOT / package, *[p.parent for p in _sources(package, "*/__init__.py")]]:
            own = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            assert len(own) <= MAX_MODULES_PER_FOLDER, f"{folder.relative_to(ROOT)}: {len(own)} modules"
            init = folder / "__init__.py"
            assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"
    for path in _modules().values():
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {lines} lines"


PRODUCT = ("qwen3_tts_gguf", "api")
"""The engine and the server: one word, one meaning across both (`qtts_client/` is a package of its own, with its
public module names; `bench/` and `tests/` are not the product)."""
DATA_FOLDERS = ("model-base", "voices")
"""The user-data folders at the top of a checkout (`qwen3_tts_gguf/data_dirs.py`): no module or package is named so."""


def test_no_two_modules_of_the_product_share_a_name():
    names: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in _sources(package, "*.py"):
            name = path.parent.name if path.name == "__init__.py" else path.stem
            if path.parent != ROOT / package or path.name != "__init__.py":
                names.setdefault(name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert shared == {}, shared
    assert not {folder.replace("-", "_") for folder in DATA_FOLDERS} & set(names)


def test_modules_import_each_others_public_names_only():
    """A `_name` is its module's own: no project module imports one from another (`bench/` did, 83 times)."""
    modules = _modules()
    private = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
                private += [(name, node.module, a.name) for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == [], private


def test_the_engines_parts_keep_their_state_to_themselves():
    """In the engine (`qwen3_tts_gguf/engine/`), an object's `_private` attribute is read only by itself: the
    scheduler composes its parts (admission, prefix cache, audio out) and feeds a Stream through their public
    methods."""
    reaching = []
    for path in _sources("qwen3_tts_gguf", "engine/*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                reaching.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert reaching == [], reaching


def test_modules_are_imported_under_their_own_names():
    """`from package import module as other` hides a module behind another word (`native as websocket` did); an
    alias may only lengthen the module's own name (`realtime_module`, beside a parameter called `realtime`)."""
    modules = _modules()
    renamed = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                renamed += [(name, f"{node.module}.{a.name}", a.asname) for a in node.names
                            if a.asname and not a.asname.startswith(a.name) and f"{node.module}.{a.name}" in modules]
    assert renamed == [], renamed


def test_the_engine_has_one_face_and_the_server_uses_it():
    """`qwen3_tts_gguf` exports what a user of the library needs, each name from the module that defines it, and
    imports none of them until it is used; `api/` takes those names from the face, never from their modules."""
    import subprocess
    import sys

    import qwen3_tts_gguf

    face = qwen3_tts_gguf._WHERE
    assert qwen3_tts_gguf.__all__ == sorted(face)
    for name, module in face.items():
        value = getattr(qwen3_tts_gguf, name)
        assert value.__module__ == module and value.__name__ == name, (name, module)
    loaded = subprocess.run([sys.executable, "-c", "import sys, qwen3_tts_gguf; "
                             "print(sorted(m for m in sys.modules if m.startswith('qwen3_tts_gguf.')))"],
                            capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    assert loaded == "[]"
    around = []
    for path in _sources("api", "*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qwen3_tts_gguf."):
                around += [(str(path.relative_to(ROOT)), node.module, a.name) for a in node.names if a.name in face]
    assert around == [], around


SERVER_FLOORS = {"entry": 5, "routes": 4, "protocols": 4, "speaking": 3, "sdk": 3, "state": 2.5, "ops": 2, "spine": 1}
"""The server's rooms, top down: what runs it (`app.py`, `server.py`, `cli_args.py`, `testing.py`); the adapters
(HTTP routes and socket protocols, side by side); the one path into the engine (`speaking/`) and the SDKs it
serves; the shared state (`state.py`: the spine's parts and ops' metrics); running a shared server (`ops/`); the
spine (config, limits, errors, schemas, the registry, voice resolution). An import goes down or stays in its room."""
ENTRY = ("app", "server", "cli_args", "testing")
ADAPTERS_DESCRIBED = {("api.routes.capabilities", "api.protocols")}
"""/v1/capabilities describes the socket protocols (their paths, subprotocols, versions): it reads them there."""


def _server_room(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in SERVER_FLOORS:
        return parts[1]
    return "entry" if parts[1:2] and parts[1] in ENTRY else "state" if parts[1:2] == ["state"] else "spine"


def test_the_servers_arrows_run_down():
    modules = _modules()
    climbs = []
    for name, path in modules.items():
        if not name.startswith("api.") or path.name == "__init__.py":
            continue
        source = _server_room(name)
        for target, _ in _imports(path, modules):
            if not target.startswith("api.") or modules[target].name == "__init__.py":
                continue
            dest = _server_room(target)
            if any(name == who and target.startswith(what) for who, what in ADAPTERS_DESCRIBED):
                continue
            if SERVER_FLOORS[dest] > SERVER_FLOORS[source] or (dest != source and SERVER_FLOORS[dest] ==
                                                                SERVER_FLOORS[source]) or (source == dest == "routes"):
                climbs.append((name, target))
    assert climbs == [], climbs


@pytest.fixture(scope="module")
def registry(tiny_cv_f32):
    registry = ModelRegistry.load([tiny_cv_f32], EngineSettings(threads=1, max_streams=2, max_pending=4))
    yield registry
    registry.close()


def test_the_openapi_document_is_the_one_recorded(registry):
    served = json.dumps(create_app(ServerConfig(webui_dir=None), registry).openapi(), indent=1,
                        ensure_ascii=False) + "\n"
    if os.environ.get("QTTS_WRITE_OPENAPI") == "1":
        OPENAPI.write_text(served)
    assert served == OPENAPI.read_text()


def _pinned(lines: list[str]) -> dict[str, str]:
    """{canonical name: version specifier} of requirement lines (comments and blank lines skipped)."""
    found = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            found[canonicalize_name(requirement.name)] = str(requirement.specifier)
    return found


def test_pyproject_installs_what_requirements_txt_lists():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = _pinned((ROOT / "requirements.txt").read_text().splitlines())
    assert listed and _pinned(pyproject["project"]["dependencies"]) == listed
    # the console command is the one `python -m qwen3_tts_gguf` runs
    module, function = pyproject["project"]["scripts"]["qtts"].split(":")
    main = ast.parse((ROOT / "qwen3_tts_gguf" / "__main__.py").read_text())
    assert any(isinstance(node, ast.ImportFrom) and node.module == module and function in [a.name for a in node.names]
               for node in ast.walk(main))
