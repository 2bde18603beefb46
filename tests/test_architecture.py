"""The import graph of specdec/ and bench/ keeps the shape ARCHITECTURE.md draws: no cycles (imports
inside functions included), layers that import only downwards, readers that never load a model.

Every module is parsed with `ast`; an edge is one import statement naming a project module (a
submodule's parent package also runs, but is not counted as an edge). A plug-in package whose
__init__ imports every module beside it (`pkgutil.iter_modules(__path__)`) depends on each.
`python -m tests.test_architecture` prints the longest dependency chains.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("specdec", "bench")
# A function may import a project module only to keep this library out of start-up
# (`specbench --help`, a bad flag); torch is imported by every specdec module anyway.
HEAVY = ("transformers",)

# specdec's layers: its modules (a package name covers its modules) and the layers it may import.
LAYERS = {
    "errors": (("specdec.errors",), ()),
    # The named settings' enums (specdec/settings.py): what core reads of a runtime's settings, below every runtime.
    "settings": (("specdec.settings",), ("errors",)),
    # The machine's fingerprint: nothing of specdec's; bench's records, compare and calibrate read it.
    "machine": (("specdec.machine",), ()),
    # specbench's own CPU kernels (kernels/csrc/, a path per instruction set), built once per path and machine class:
    # what they need of the CPU is machine's.
    # The runtimes' registry (specdec/runtime_registry.py): what every layer asks of a runtime by name; its
    # declarations (specdec/runtimes/) sit above what they load and are imported by name on its first lookup.
    "registry": (("specdec.runtime_registry",), ("errors", "machine")),
    "kernels": (("specdec.kernels",), ("errors", "settings", "machine", "registry")),
    # llamacpp_probe.py keeps its verdicts per machine class; packed.py runs on the kernels.
    "backends": (("specdec.backends",), ("errors", "settings", "machine", "kernels", "registry")),
    # The loop and what it needs: the folder specdec/core/ is the layer.
    "core": (("specdec.core",), ("errors", "settings", "registry", "backends")),
    # The package's public names (specdec/__init__.py): the core's, re-exported.
    "api": (("specdec",), ("errors", "settings", "registry", "backends", "core")),
    "models": (("specdec.models",), ("errors", "settings", "registry", "backends", "kernels")),
    # Each runtime's declaration and loader: over the backends it builds and the models code it loads with.
    "runtimes": (("specdec.runtimes",), ("errors", "settings", "machine", "kernels", "registry", "backends", "models")),
    # The verifier protocol and the edge's client: the engine verifies through them.
    "transport": (("specdec.remote", "specdec.remote.client", "specdec.remote.protocol", "specdec.remote.payloads"),
                  ("errors", "settings", "backends", "core")),
    # What both the engine and the server build from a loaded model (its decoding constraints).
    "assembly": (("specdec.constraint_profiles",), ("errors", "settings", "backends", "core", "models")),
    "engine": (("specdec.engine",), ("errors", "settings", "registry", "backends", "core", "models", "transport",
                                      "assembly")),
    # The verifier server: the cloud side of the protocol, built on the core and a loaded model;
    # never on the engine (the edge's facade), so neither side's changes ripple into the other.
    # Its modules: the connection loop (server), the requests' handlers, a session, its config, the batcher,
    # and the server on a thread for tests (background).
    "serve": (("specdec.remote.server", "specdec.remote.handlers", "specdec.remote.server_session",
               "specdec.remote.server_config", "specdec.remote.batcher", "specdec.remote.background"),
              ("errors", "settings", "registry", "backends", "core", "models", "transport", "assembly")),
}
# bench's layers (ARCHITECTURE.md): a package and the layers it may import. `bench` itself, its
# conftest, the pytest-benchmark suites (bench/test_bench_*.py) and the data folders' scripts
# (bench/samples/make_samples.py) sit outside them.
BENCH_LAYERS = {
    "core": (("bench.core",), ()),
    "derive": (("bench.derive",), ("core",)),
    "measure": (("bench.measure",), ("core", "derive")),
    "read": (("bench.read",), ("core", "derive")),
    "commands": (("bench.commands", "bench.cli"), ("core", "derive", "measure", "read")),
}
# Reports only read results: these never reach a module that loads or runs a model.
READERS = ("bench.core", "bench.derive", "bench.read")
RUNS_MODELS = ("specdec.engine", "specdec.core.decode", "specdec.models")
# What a point is, which way a metric moves and every derived number are the readers' own: they
# never reach what plans or runs a measurement, nor a command's flags.
MEASURES = ("bench.measure", "bench.commands", "bench.cli")


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: bool

    def where(self) -> str:
        return f"{modules()[self.source].relative_to(ROOT)}:{self.line}"


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _known(target: str) -> str | None:
    """The project module an import names (`from specdec.core import config` names specdec.core.config)."""
    while target and target not in modules():
        target = target.rpartition(".")[0]
    return target or None


@cache
def parsed(name: str) -> tuple[list[Import], frozenset[str]]:
    """(project imports, third-party top-level names imported at module level) of one module."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports, third_party = [], set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                else:
                    base = child.module or ""
                    if child.level:
                        anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join(anchor + ([base] if base else []))
                    names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base
                             for alias in child.names]
                for full in names:
                    if full.split(".")[0] in PACKAGES:
                        target = _known(full)
                        if target and target != name:
                            imports.append(Import(name, target, child.lineno, in_function))
                    elif not in_function:
                        third_party.add(full.split(".")[0])
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    source = path.read_text(encoding="utf-8")
    if path.name == "__init__.py" and "pkgutil.iter_modules(__path__)" in source:  # a plug-in package
        line = source[: source.index("pkgutil.iter_modules(__path__)")].count("\n") + 1
        imports += [Import(name, child, line, False) for child in modules() if child.rpartition(".")[0] == name]
    return imports, frozenset(third_party)


def edges() -> list[Import]:
    return [i for name in modules() for i in parsed(name)[0]]


def graph(include_functions: bool = True) -> dict[str, list[Import]]:
    out = {name: [] for name in modules()}
    for i in edges():
        if include_functions or not i.in_function:
            out[i.source].append(i)
    return out


def find_cycle(g: dict[str, list[Import]]) -> list[Import] | None:
    state, stack = {}, []  # 1: on the DFS path, 2: done

    def dfs(name: str) -> list[Import] | None:
        state[name] = 1
        for i in sorted(g[name], key=lambda i: i.target):
            if state.get(i.target) == 1:
                start = next(n for n, e in enumerate(stack) if e.source == i.target) if stack else 0
                return stack[start:] + [i]
            stack.append(i)
            found = None if state.get(i.target) == 2 else dfs(i.target)
            stack.pop()
            if found:
                return found
        state[name] = 2
        return None

    for name in sorted(g):
        if name not in state and (cycle := dfs(name)):
            return cycle
    return None


def layer_of(name: str) -> str | None:
    matches = [(max(len(p) for p in members if within(name, (p,))), layer)
               for layer, (members, _) in LAYERS.items() if within(name, members)]
    return max(matches)[1] if matches else None


@cache
def heavy(name: str) -> bool:
    """True if importing `name` imports a HEAVY library (through module-level imports)."""
    imports, third_party = parsed(name)
    return bool(third_party & set(HEAVY)) or any(heavy(i.target) for i in imports if not i.in_function)


def reachable(name: str) -> dict[str, list[Import]]:
    """Every module `name` imports, directly or not, with one chain of imports to it."""
    seen, todo = {name: []}, [name]
    g = graph()
    while todo:
        current = todo.pop()
        for i in g[current]:
            if i.target not in seen:
                seen[i.target] = seen[current] + [i]
                todo.append(i.target)
    return seen


def chain_text(chain: list[Import]) -> str:
    return " -> ".join([chain[0].source] + [f"{i.target} ({i.where()})" for i in chain])


# --- the rules ------------------------------------------------------------------------------
def test_no_import_cycles():
    cycle = find_cycle(graph(include_functions=True))
    assert cycle is None, (
        f"import cycle: {chain_text(cycle)}. A cycle is a design question: move what both need into a "
        "module both import, not the import into a function"
    )


def test_specdec_never_imports_bench():
    bad = [i for i in edges() if within(i.source, ("specdec",)) and within(i.target, ("bench",))]
    assert not bad, f"specdec (the engine) imports the harness: {[f'{i.source} -> {i.target} ({i.where()})' for i in bad]}"


def test_every_specdec_module_has_a_layer():
    missing = [name for name in modules() if within(name, ("specdec",)) and layer_of(name) is None]
    assert not missing, f"no layer for {missing}: add it to LAYERS here and to ARCHITECTURE.md"


def test_layers_import_only_downwards():
    bad = []
    for i in edges():
        if within(i.source, ("specdec",)) and within(i.target, ("specdec",)):  # bench: the test above
            source, target = layer_of(i.source), layer_of(i.target)
            if target != source and target not in LAYERS[source][1]:
                bad.append(f"{i.source} ({source}) imports {i.target} ({target}) at {i.where()}; "
                           f"{source} may import only {', '.join(LAYERS[source][1]) or 'nothing else'}")
    assert not bad, "\n".join(bad)


def bench_layer_of(name: str) -> str | None:
    return next((layer for layer, (members, _) in BENCH_LAYERS.items() if within(name, members)), None)


def _outside_layers(name: str) -> bool:
    last = name.rpartition(".")[2]
    return name in ("bench", "bench.conftest") or last.startswith("test_bench_") or within(name, ("bench.samples",))


def test_every_bench_module_has_a_layer():
    missing = [name for name in modules() if within(name, ("bench",)) and not _outside_layers(name)
               and bench_layer_of(name) is None]
    assert not missing, (f"no layer for {missing}: put it in bench/core, measure, derive, read or commands "
                         "(ARCHITECTURE.md says which), or add the package to BENCH_LAYERS and ARCHITECTURE.md")


def test_bench_layers_import_only_downwards():
    bad = []
    for i in edges():
        if within(i.source, ("bench",)) and within(i.target, ("bench",)) and not _outside_layers(i.source):
            source, target = bench_layer_of(i.source), bench_layer_of(i.target)
            if target != source and target not in BENCH_LAYERS[source][1]:
                bad.append(f"{i.source} ({source}) imports {i.target} ({target}) at {i.where()}; "
                           f"{source} may import only {', '.join(BENCH_LAYERS[source][1]) or 'nothing else in bench'}")
    assert not bad, "\n".join(bad)


def test_readers_never_load_a_model():
    bad = []
    for name in modules():
        if within(name, READERS):
            for target, chain in reachable(name).items():
                if within(target, RUNS_MODELS):
                    bad.append(chain_text(chain))
    assert not bad, "reports only read results, but: " + "\n".join(sorted(bad)[:5])


def test_readers_never_reach_what_measures():
    bad = [chain_text(chain) for name in modules() if within(name, READERS)
           for target, chain in reachable(name).items() if within(target, MEASURES)]
    assert not bad, "a reader reaches what measures (take the point from bench/core/point.py): " + "\n".join(sorted(bad)[:5])


def test_imports_inside_functions_only_defer_a_heavy_library():
    bad = [f"{i.source} -> {i.target} ({i.where()})" for i in edges() if i.in_function and not heavy(i.target)]
    assert not bad, (
        f"imports of project modules inside functions that do not defer {', '.join(HEAVY)}: {bad}; "
        "import them at the top (if that makes a cycle, the design needs a change, not a hidden import)"
    )


def tree_entries() -> dict[tuple[str, ...], str]:
    """ARCHITECTURE.md's package tree (its first fenced block): each folder that starts a line (`name/`),
    as its path of folder names, -> its entry: that line and the lines below it indented deeper."""
    lines = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").split("```")[1].splitlines()
    entries, open_folders = {}, []  # open_folders: (indent, path) of the folders around a line
    for n, line in enumerate(lines):
        if not (match := re.match(r"( *)(\w+)/(?:\s|$)", line)):
            continue
        indent = len(match.group(1))
        while open_folders and open_folders[-1][0] >= indent:
            open_folders.pop()
        path = (open_folders[-1][1] if open_folders else ()) + (match.group(2),)
        end = next((k for k in range(n + 1, len(lines))
                    if lines[k].strip() and len(lines[k]) - len(lines[k].lstrip()) <= indent), len(lines))
        entries[path] = "\n".join(lines[n:end])
        open_folders.append((indent, path))
    return entries


def test_architecture_md_names_every_module():
    """Every module is named in its folder's entry of the tree, nested ones too (`worker.py` under
    measure/'s `sweep/`): a folder that shares its parent's line (`report/ (inputs.py, ...)`) is named
    there, with its modules."""
    entries = tree_entries()
    missing = []
    for path in modules().values():
        parts = path.relative_to(ROOT).parts
        if parts[-1].startswith("test_") or parts[-1] == "conftest.py":
            continue
        folders = parts[:-1]
        placed = max((folders[:n] for n in range(1, len(folders) + 1) if folders[:n] in entries), key=len)
        entry = entries[placed]
        names = [f"{folder}/" for folder in folders[len(placed):]]
        if parts[-1] != "__init__.py":
            names.append(parts[-1])
        if not all(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", entry) for name in names):
            missing.append(f"{'/'.join(parts)} (name {' and '.join(names)} in {'/'.join(placed)}/'s entry)")
    assert not missing, "ARCHITECTURE.md does not place:\n" + "\n".join(sorted(missing))


def test_a_file_name_means_one_thing():
    """Outside bench/commands/ (each named after its command) no two modules share a file name: the
    escalation gate and the regression gate were both `gate.py`. `registry.py` is a role of its own:
    a package's table of names (the policies', the models')."""
    by_name: dict[str, list[str]] = {}
    for path in modules().values():
        rel = path.relative_to(ROOT)
        if path.name in ("__init__.py", "conftest.py") or rel.parts[:2] == ("bench", "commands"):
            continue
        by_name.setdefault(path.name, []).append(str(rel))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1 and name != "registry.py"}
    assert not shared, f"one file name, several modules: {shared}; name each after its role"


# --- the tiny script ------------------------------------------------------------------------
def longest_chain(prefix: str = "", include_functions: bool = True) -> list[str]:
    """The longest import chain among the modules named `prefix...` (the graph must be acyclic)."""
    g = {name: sorted({i.target for i in imports if i.target.startswith(prefix)})
         for name, imports in graph(include_functions).items() if name.startswith(prefix)}

    @cache
    def longest_from(name: str) -> tuple[str, ...]:
        return max(((name, *longest_from(t)) for t in g[name]), key=len, default=(name,))

    return list(max((longest_from(name) for name in sorted(g)), key=len))


if __name__ == "__main__":
    for include_functions in (False, True):
        what = "all imports" if include_functions else "module-level imports"
        if cycle := find_cycle(graph(include_functions)):
            print(f"{what}: cycle {chain_text(cycle)}")
            continue
        for prefix in ("", "specdec", "specdec.", "bench"):
            chain = longest_chain(prefix, include_functions)
            print(f"{what}, {prefix or 'everything'}: {len(chain) - 1} edges: {' -> '.join(chain)}")
    sys.exit(0)
