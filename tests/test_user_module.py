"""Loading a user's module file the way TFX's module_file does, and failing clearly when it is broken."""
import pytest

from hpml.components.errors import SpecError
from hpml.components.user_module import load_function


def test_a_broken_module_names_file_and_line_and_a_fixed_one_loads_in_the_same_process(tmp_path):
    module = tmp_path / "user_module.py"
    module.write_text("def run_fn(fn_args):\n    return 'first'\n")
    assert load_function(str(module), "run_fn")(None) == "first"

    module.write_text("def run_fn(fn_args):\n    return 'edited'\n")
    assert load_function(str(module), "run_fn")(None) == "edited", "an edited module file must be loaded afresh"

    module.write_text("import os\n\ndef run_fn(fn_args)\n    return 1\n")
    with pytest.raises(SpecError, match=rf"^user module {module}:3 failed to load: SyntaxError: "):
        load_function(str(module), "run_fn")
    module.write_text("import not_a_real_package_xyz\n\ndef run_fn(fn_args):\n    return 2\n")
    for _ in range(2):  # the failed import is not left behind as a half-loaded module
        with pytest.raises(SpecError, match=r"failed to load: ModuleNotFoundError: No module named "
                                            r"'not_a_real_package_xyz'"):
            load_function(str(module), "run_fn")
    with pytest.raises(SpecError, match="has no function 'trainer_fn'"):
        module.write_text("def run_fn(fn_args):\n    return 3\n")
        load_function(str(module), "trainer_fn")
