"""The house rules that keep the code easy to read, checked on every change: no module of the framework grows into a
grab bag, and no function runs on past a screen."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FRAMEWORK = ("components", "pipelines", "hpml")
MODULE_LINES = 400
FUNCTION_LINES = 60


def _modules():
    for folder in FRAMEWORK:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_framework_module_is_longer_than_400_lines():
    long = {str(path.relative_to(ROOT)): lines for path in _modules()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}
    assert not long, f"split these modules by what each part does (lines): {long}"


def test_no_framework_function_is_longer_than_60_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"split these functions into named steps (lines): {long}"


def test_the_checks_see_the_framework():
    """The rules above hold because they read the code, not because they found none."""
    modules = list(_modules())
    assert len(modules) > 100 and ROOT / "components" / "files.py" in modules
