"""The package's stages import downward only (docs/design.md, "Layout"): commands → measure | training | export →
decoding | serving → pairs → runtime → base."""

import ast
from pathlib import Path

import specdec_cli

PACKAGE = Path(specdec_cli.__file__).parent
BASE = {"errors", "limits", "atomic", "prompts", "notices"}  # small pieces every stage uses
RANK = {"base": 0, "runtime": 1, "pairs": 2, "decoding": 3, "serving": 3, "measure": 4, "training": 4, "export": 4, "top": 5}
RUNTIME = {"quantize", "native_kernels", "gguf_int4", "fused_projections", "lean_forward", "rowwise_attention", "dense_prefill",
           "threads"}


def stage(module: str) -> str:
    """The stage of a dotted module name inside specdec_cli."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("cli", "commands", "__main__"):
        return "top"
    if parts[0] in BASE:
        return "base"
    assert parts[0] in RANK, f"{module} belongs to no declared stage: add it to the layout (docs/design.md, this test)"
    return parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import of specdec_cli in a file, lazy ones included."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("specdec_cli"):
                found += [(node.lineno, target)] if node.module else [(node.lineno, f"{target}.{a.name}")
                                                                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("specdec_cli")]
    return found


def test_stage_of_every_module_is_declared_and_imports_go_downward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = stage(module_name(path))
        for line, target in imports(path):
            other = stage(target)
            if other != own and RANK[other] >= RANK[own]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({own}) imports {target} ({other})")
    assert not upward, "imports against the layout:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import():
    assert stage("specdec_cli.decoding.engine") == "decoding"
    assert RANK[stage("specdec_cli.measure.loop_bench")] > RANK[stage("specdec_cli.decoding.engine")]
    assert stage("specdec_cli.commands.generate") == "top" and stage("specdec_cli.errors") == "base"
    found = imports(PACKAGE / "decoding" / "loaded_pair.py")
    assert any(target == "specdec_cli.pairs.loading" for _, target in found)  # relative imports resolved
    found = imports(PACKAGE / "decoding" / "drafters" / "head.py")  # and from a stage's subpackage
    assert {"specdec_cli.runtime.quantize", "specdec_cli.decoding.kv", "specdec_cli.decoding.drafters.base"} <= {
        target for _, target in found}


def test_the_drafters_package_face_does_nothing_at_import():
    """decoding/drafters/ is one module per kind, imported from the modules themselves: its face
    imports none of them, so that reading the memory file's format (suffix_file) loads no torch."""
    face = ast.parse((PACKAGE / "decoding" / "drafters" / "__init__.py").read_text())
    assert not [node for node in ast.walk(face) if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_the_quantised_target_runtime_is_its_own_stage_and_the_top_level_stays_small():
    assert RUNTIME <= {p.stem for p in (PACKAGE / "runtime").glob("*.py")}
    assert not RUNTIME & {p.stem for p in (PACKAGE / "pairs").glob("*.py")}, "runtime modules belong in runtime/"
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, f"{len(top)} top-level modules: {top}"  # the CLI's three and the base pieces
    assert stage("specdec_cli.runtime.quantize") == "runtime"
    assert RANK["runtime"] < RANK["pairs"]  # pairs/loading.py builds a fast target from the runtime, never the reverse
