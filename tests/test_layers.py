"""The package is built in layers: a module imports only modules of its own layer or below, never in a circle.

``LAYERS`` lists them bottom-up (``docs/architecture.md`` draws them). These checks hold the line:

* **Every import statement** of every module -- including imports inside functions and under
  ``TYPE_CHECKING``, which a run never executes -- read from the source: each must reach its own layer or a
  lower one, and the graph they form must have no circle. Importing ``minfer.a.b`` also runs the package
  ``minfer.a``'s ``__init__``, so that counts as an import of ``minfer.a`` too.
* **What importing does**, in a fresh interpreter: each module is imported in layer order, and the modules it
  pulls in must all sit at or below its layer (so a package ``__init__`` cannot drag in a higher layer).
* **Packages point one way.** Read as packages (``minfer.sim``, ``minfer.kv``, ``minfer.engine``, ...), the
  imports form no circle either. The simulator once kept its calibration and validation, which drive a whole
  engine, inside ``minfer/sim/``, while the engine imported ``minfer.sim`` for its executor: no module imported
  itself back, but the package ``sim`` sat both below and above the engine. Now ``minfer/validate/`` holds them,
  above both, and the simulator reaches neither the engine nor the model runner (``SIMULATOR_NEVER_REACHES``).

How a circle is caught, for the record: the scheduler once imported ``shedding.py`` while ``shedding.py``
imported the scheduler for a type hint. Put ``from minfer.scheduler.scheduler import Scheduler`` back under
``if TYPE_CHECKING:`` in ``minfer/scheduler/shedding.py`` and ``test_no_upward_imports_and_no_circles`` fails
with ``import circle: minfer.scheduler.scheduler -> minfer.scheduler.shedding -> minfer.scheduler.scheduler``.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minfer"

LAYERS: list[tuple[str, list[str]]] = [  # bottom-up; a module may import its own layer and those below
    ("foundation", ["minfer.types", "minfer.input_checks", "minfer.units", "minfer.paths", "minfer.jsonl",
                    "minfer.notices"]),
    ("values", ["minfer.config", "minfer.request", "minfer.plan", "minfer.trace", "minfer.cpu_malloc",
                "minfer.workload", "minfer.metrics"]),
    ("primitives", ["minfer.kv", "minfer.kv.block_pool", "minfer.kv.host_pool", "minfer.ops", "minfer.ops.attention",
                    "minfer.sampler"]),
    ("kernels and model", ["minfer.ops.*", "minfer.model", "minfer.model.*", "minfer.kv.*", "minfer.quant",
                           "minfer.quant.*"]),
    ("speed-ups", ["minfer.accelerate"]),  # stand-ins for the model's modules: above both the model and the kernels
    ("scheduling", ["minfer.scheduler", "minfer.scheduler.*", "minfer.detokenizer"]),
    ("executors", ["minfer.executor", "minfer.runner", "minfer.cuda_graphs", "minfer.sim", "minfer.sim.*",
                   "minfer.spec", "minfer.spec.*"]),
    ("engine", ["minfer.engine", "minfer.faults", "minfer"]),  # the package itself: the public API, exported lazily
    ("tools", ["minfer.validate", "minfer.validate.*", "minfer.baselines", "minfer.bench", "minfer.capacity",
               "minfer.viz",
               "minfer.viz.*", "minfer.notebook", "minfer.serve", "minfer.serve.*", "minfer.loadgen",
               "minfer.roofline", "minfer.step_time", "minfer.peers", "minfer.loadtools", "minfer.quality",
               "minfer.capstone", "minfer.exercises", "minfer.exercises.*", "minfer.disagg", "minfer.kv_tier"]),
]

# The simulator is the executor that runs no model: beside the model runner, not on top of it, and under the
# engine -- so nothing it imports, directly or through a package ``__init__``, may reach these.
SIMULATOR_NEVER_REACHES = {"minfer.engine", "minfer.runner", "minfer.cuda_graphs"}


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def layer_of(module: str) -> int:
    """The first layer that names the module exactly, else the first whose pattern matches it."""
    for exact in (True, False):
        for i, (_, patterns) in enumerate(LAYERS):
            if any(module == p if exact else fnmatch.fnmatchcase(module, p) for p in patterns):
                return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")


def root_exports() -> dict[str, str]:
    """``from minfer import LLM`` imports the module that defines it (the package exports lazily)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS":
            return ast.literal_eval(node.value)
    return {}


def imports_of(module: str, known: set[str], exports: dict[str, str]) -> set[str]:
    """Every minfer module ``module``'s source imports, with the packages whose ``__init__`` that runs."""
    path = PACKAGE.parent / (module.replace(".", "/") + ("/__init__.py" if module in PACKAGES else ".py"))
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names if a.name.startswith("minfer")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minfer"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in known:
                    targets.add(sub)
                elif node.module == "minfer" and a.name in exports:
                    targets.add(exports[a.name])
                else:
                    targets.add(node.module)
    own_packages = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    for t in list(targets):  # importing minfer.a.b runs minfer.a's __init__ (the root package exports lazily)
        parts = t.split(".")
        targets |= {".".join(parts[:i]) for i in range(2, len(parts))}
    return {t for t in targets if t != module and t not in own_packages and t in known}


PACKAGES = {p.parent.relative_to(PACKAGE.parent).as_posix().replace("/", ".") for p in PACKAGE.rglob("__init__.py")}


def import_graph() -> dict[str, set[str]]:
    known = set(module_names())
    exports = root_exports()
    return {m: imports_of(m, known, exports) for m in sorted(known)}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in graph:
        if m not in state and (found := visit(m)):
            return found
    return None


def package_of(module: str) -> str:
    """The top-level unit a module belongs to: ``minfer.sim.cost`` -> ``minfer.sim``, ``minfer.engine`` itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph read as packages: an edge wherever a module of one imports a module of another. (The root
    package ``minfer`` is left out: every module is inside it, and it only re-exports.)"""
    packages: dict[str, set[str]] = {}
    for m, targets in graph.items():
        if m != "minfer":
            edges = packages.setdefault(package_of(m), set())
            edges |= {package_of(t) for t in targets if t != "minfer" and package_of(t) != package_of(m)}
    return packages


def imports_reached_from(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (package ``__init__``s included)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for t in graph[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_every_module_has_a_layer():
    for m in module_names():
        layer_of(m)


def test_no_upward_imports_and_no_circles():
    graph = import_graph()
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in graph.items() for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert not upward, "imports that reach a higher layer:\n" + "\n".join(upward)
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_checks_see_a_circle():
    """The cycle finder is not vacuous: a graph with a circle is caught."""
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_packages_point_one_way():
    circle = find_circle(package_graph(import_graph()))
    assert circle is None, "packages import each other in a circle: " + " -> ".join(circle or [])


def test_the_package_check_sees_what_modules_hide():
    """Two packages can import each other without any module importing itself back -- the old simulator's shape:
    the engine imported ``sim.executor`` while ``sim.calibrate`` imported the engine."""
    old = {"minfer.engine": {"minfer.sim.executor"}, "minfer.sim.executor": set(),
           "minfer.sim.calibrate": {"minfer.engine"}}
    assert find_circle(old) is None
    assert find_circle(package_graph(old)) == ["minfer.engine", "minfer.sim", "minfer.engine"]


def test_the_simulator_is_a_leaf_under_the_engine():
    graph = import_graph()
    for m in sorted(graph):
        if package_of(m) == "minfer.sim":
            reached = imports_reached_from(graph, m) & SIMULATOR_NEVER_REACHES
            assert not reached, f"{m} reaches {sorted(reached)}: the simulator must run without them"


def test_describing_requests_imports_no_torch():
    """Requests, workloads, configs, metrics and traces are plain descriptions: a client, the simulator and the
    load generator use them without PyTorch (a seeded request makes its ``torch.Generator`` when it samples)."""
    script = ("import sys\n"
              "import minfer.config, minfer.metrics, minfer.request, minfer.trace, minfer.workload\n"
              "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent, timeout=120)
    assert out.stdout.strip() == "False", "a module that only describes requests imports torch"


def test_importing_each_module_loads_nothing_above_it():
    """In a fresh interpreter, import every module in layer order and record what each one pulls in. (The
    package itself comes along with the first import, and loads nothing: it exports lazily. ``__main__``
    modules are left out: importing one runs its program.)"""
    order = sorted((m for m in module_names() if not m.endswith(".__main__")), key=layer_of)  # entry points run
    script = (
        "import importlib, json, sys\n"
        f"order = {order!r}\n"
        "pulled = {}\n"
        "for m in order:\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(m)\n"
        "    pulled[m] = sorted(x for x in set(sys.modules) - before if x.startswith('minfer.'))\n"
        "print(json.dumps(pulled))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env=os.environ | {"TRITON_INTERPRET": "1"}, cwd=PACKAGE.parent, timeout=300)
    pulled = json.loads(out.stdout.strip().splitlines()[-1])
    known = set(module_names())
    upward = [f"importing {m} ({LAYERS[layer_of(m)][0]}) loads {x} ({LAYERS[layer_of(x)][0]})"
              for m, xs in pulled.items() for x in xs if x in known and layer_of(x) > layer_of(m)]
    assert not upward, "\n".join(upward)


def test_executors_never_import_the_scheduler():
    """Issue 34: the step's plan (``minfer.plan``) is the contract between the scheduler and the executors, so an
    executor reads the plan and never the scheduler -- neither by an import statement, nor through any module or
    package ``__init__`` that one of its imports reaches, nor at run time in a fresh interpreter."""
    executors = next(i for i, (name, _) in enumerate(LAYERS) if name == "executors")
    modules = [m for m in module_names() if layer_of(m) == executors]
    assert {"minfer.executor", "minfer.runner", "minfer.sim.executor"} <= set(modules)
    graph = import_graph()

    def reached(module: str) -> set[str]:
        seen, todo = set(), [module]
        while todo:
            for t in graph[todo.pop()] - seen:
                seen.add(t)
                todo.append(t)
        return seen

    def is_scheduler(m: str) -> bool:
        return m == "minfer.scheduler" or m.startswith("minfer.scheduler.")

    through = {m: sorted(filter(is_scheduler, reached(m))) for m in modules}
    assert not any(through.values()), f"executors that reach the scheduler: { {m: s for m, s in through.items() if s} }"
    script = (f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
              "print(sorted(m for m in sys.modules if m == 'minfer.scheduler' or m.startswith('minfer.scheduler.')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env=os.environ | {"TRITON_INTERPRET": "1"}, cwd=PACKAGE.parent, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]", f"importing the executors loads {out.stdout.strip()}"
