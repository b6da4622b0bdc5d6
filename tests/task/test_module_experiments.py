"""Experiments of a user's own module: ``cadence train -e mymodels:NAME`` and ``-e
path/to/mymodels.py:NAME``; the run records the module (``experiment_module``) and every later
command finds it again, importing only the user's own code (`cadence.task.module_experiments`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fakes import USER_MODELS

import cadence
from cadence import ConfigError, NotRegisteredError, load_config, run_experiment, save_config
from cadence.task.cli import main
from cadence.task.module_experiments import FILE_MODULE_PREFIX

REPO = Path(__file__).parent.parent.parent
LAUNCHER = "import sys\nfrom cadence.task.cli import main\nsys.exit(main())\n"
"""The ``cadence`` console script, as pip writes it: its folder, not the current one, is first on
``sys.path``."""


def project(folder: Path, module: str = "mymodels", experiment: str = "my_experiment") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(USER_MODELS.format(module=module, experiment=experiment))
    return path


@pytest.fixture(scope="module")
def cadence_command(tmp_path_factory):
    """Runs the ``cadence`` command in a new process, as the console script does (the current
    folder is not on ``sys.path`` by itself), importing this checkout's cadence."""
    launcher = tmp_path_factory.mktemp("bin") / "cadence_command.py"
    launcher.write_text(LAUNCHER)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    where = subprocess.run([sys.executable, "-c", "import cadence; print(cadence.__file__)"],
                           env=env, cwd=launcher.parent, capture_output=True, text=True)
    assert Path(where.stdout.strip()) == REPO / "cadence" / "__init__.py", where

    def run(cwd: Path, *argv: str, status: int = 0) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, str(launcher), *argv], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == status, done.stderr
        return done

    return run


def params(run: Path) -> dict:
    return yaml.safe_load((run / "params.yaml").read_text())


# ---------------------------------------------------------------------------- round trips


@pytest.mark.slow  # new processes: the record is all they have
def test_a_module_of_the_current_folder_trains_resumes_and_evaluates_without_repeating_e(
        tmp_path, cadence_command, capsys, monkeypatch, user_modules):
    project(tmp_path)
    first = cadence_command(tmp_path, "train", "-e", "mymodels:my_experiment", "-m", "run",
                            "--no-progress")
    assert "Experiment mymodels:my_experiment, mode train_and_eval" in first.stderr
    saved = params(tmp_path / "run")
    assert (saved["experiment"], saved["experiment_module"]) == ("my_experiment", "mymodels")
    assert saved["task_config_class"] == "mymodels.BlobsConfig"

    # A new process: nothing but the record says where the experiment is.
    again = cadence_command(tmp_path, "train", "-m", "run", "--no-progress", "--set",
                            "trainer.train_steps=6", "--allow-config-change")
    assert ("Importing mymodels: run/params.yaml records it as the module of experiment "
            "my_experiment.") in again.stderr
    assert "Restored run/checkpoints/ckpt-4" in again.stderr
    assert (tmp_path / "run" / "checkpoints" / "ckpt-6").is_dir()
    assert params(tmp_path / "run")["trainer"]["train_steps"] == 6

    monkeypatch.chdir(tmp_path)  # (in this process, where mymodels was never imported)
    assert "mymodels" not in sys.modules
    assert main(["eval", "-m", "run"]) == 0
    assert "Evaluation: accuracy=" in capsys.readouterr().out
    assert main(["eval", "-m", "run", "--checkpoint", "best"]) == 0
    best = capsys.readouterr()
    assert "Evaluation: accuracy=" in best.out and "Evaluating run/best" in best.err


@pytest.mark.slow  # new processes: the record is all they have
def test_a_file_named_by_its_path_from_another_folder_and_a_function_that_is_not_registered(
        tmp_path, cadence_command, capsys, monkeypatch, user_modules):
    project(tmp_path / "project")
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["train", "-e", "../project/mymodels.py:wide", "-m", "run",
                 "--no-progress"]) == 0
    saved = params(here / "run")
    assert (saved["experiment"], saved["experiment_module"]) == ("wide",
                                                               "../project/mymodels.py")
    assert saved["task"]["hidden"] == 16  # the function's config
    assert saved["task_config_class"] == f"{FILE_MODULE_PREFIX}mymodels.BlobsConfig"

    again = cadence_command(here, "train", "-m", "run", "--no-progress", "--set",
                            "trainer.train_steps=6", "--allow-config-change")
    assert "Importing ../project/mymodels.py" in again.stderr
    assert (here / "run" / "checkpoints" / "ckpt-6").is_dir()
    capsys.readouterr()
    assert main(["eval", "-m", "run", "--checkpoint", "best"]) == 0
    assert "Evaluation: accuracy=" in capsys.readouterr().out


def test_inspect_and_config_read_such_a_run_and_inspect_imports_nothing(tmp_path, capsys,
                                                                         monkeypatch,
                                                                         user_modules):
    project(tmp_path, "inspected")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-e", "inspected:my_experiment", "-m", "run", "--no-progress"]) == 0
    capsys.readouterr()
    # A module that would leave a mark if imported: `inspect` reads text only.
    (tmp_path / "inspected.py").write_text("open('IMPORTED', 'w').close()\n")
    module = sys.modules.pop("inspected")
    assert main(["inspect", "run"]) == 0
    out = capsys.readouterr().out
    assert "experiment: my_experiment" in out and "experiment_module: inspected" in out
    assert not (tmp_path / "IMPORTED").exists() and "inspected" not in sys.modules

    sys.modules["inspected"] = module  # (imported again, it would register a second time)
    project(tmp_path, "inspected")
    assert main(["config", "-m", "run"]) == 0
    printed = capsys.readouterr()
    assert "Importing inspected: run/params.yaml records it" in printed.err
    assert yaml.safe_load(printed.out)["experiment_module"] == "inspected"


# ---------------------------------------------------------------------------- the Python API


def test_load_config_and_run_experiment_take_the_same_spelling(tmp_path, monkeypatch,
                                                               user_modules):
    project(tmp_path, "api_models", "api_experiment")
    monkeypatch.chdir(tmp_path)
    config = load_config("api_models:api_experiment", overrides=["task.hidden=4"])
    assert (config.experiment, config.experiment_module, config.task.hidden) == (
        "api_experiment", "api_models", 4)
    # The registered function by its own name is the registered experiment.
    assert load_config("api_models:make_config").experiment == "api_experiment"
    wide = load_config("./api_models.py:wide")
    assert (wide.experiment, wide.experiment_module, wide.task.hidden) == (
        "wide", "api_models.py", 16)

    model, logs = run_experiment("api_models:api_experiment", "train_and_eval", "run")
    assert "accuracy" in logs and sum(p.numel() for p in model.parameters()) == 51
    # The saved file reloads exactly, through the module it records.
    save_config(wide, tmp_path / "wide.yaml")
    assert load_config(config_files=[tmp_path / "wide.yaml"]) == wide


def test_the_current_folder_is_importable_as_python_m_makes_it(tmp_path, monkeypatch,
                                                               user_modules):
    project(tmp_path, "folder_models", "folder_experiment")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_config("folder_models:folder_experiment").experiment_module == "folder_models"
    assert sys.path[0] == str(tmp_path)


def test_a_built_in_experiment_named_by_its_module_records_no_module(user_modules):
    config = load_config("cadence.task.experiments.digits:digits")
    assert (config.experiment, config.experiment_module) == ("digits", "")
    assert config == load_config("digits")


def test_a_file_imported_twice_is_one_module_and_its_dataclasses_work(tmp_path, monkeypatch,
                                                                        user_modules):
    path = project(tmp_path / "a", "twice", "twice_experiment")
    monkeypatch.chdir(tmp_path)
    first = load_config(f"{path}:twice_experiment")
    second = load_config("a/twice.py:twice_experiment")
    assert type(first.task) is type(second.task)  # the same class: one import
    assert type(first.task).__module__ == f"{FILE_MODULE_PREFIX}twice"


# ---------------------------------------------------------------------------- what is imported


def recorded(run: Path, module: str) -> None:
    text = (run / "params.yaml").read_text()
    lines = [f"experiment_module: {module}" if line.startswith("experiment_module:") else line
             for line in text.splitlines()]
    (run / "params.yaml").write_text("\n".join(lines) + "\n")


@pytest.fixture
def trained(tmp_path, monkeypatch, capsys, user_modules):
    """A run of a module of the current folder, trained in this process."""
    project(tmp_path, "record_models", "record_experiment")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-e", "record_models:record_experiment", "-m", "run",
                 "--no-progress"]) == 0
    capsys.readouterr()
    return tmp_path / "run"


PAYLOAD = "open('PAYLOAD_RAN', 'w').close()\n"


@pytest.mark.parametrize(("module", "says"), [
    ("os", r"but os is not a module of the current folder \(.*\); cadence imports a recorded "
           r"module only from there\. Run the command from the folder the run was started in, "
           r"or pass -e os:record_experiment to import it yourself\."),
    ("run/payload.py", r"whose file run/payload.py is inside that run directory: cadence never "
                       r"runs code that came with a run\."),
    ("run.payload", r"whose file .*/run/payload.py is inside that run directory"),
])
def test_a_run_s_record_imports_only_the_current_folder_s_own_code(trained, capsys, module,
                                                                   says):
    (trained / "payload.py").write_text(PAYLOAD)
    recorded(trained, module)
    for command in (["eval", "-m", "run"], ["train", "-m", "run"], ["config", "-m", "run"]):
        assert main(command) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("cadence: error: 'run/params.yaml' records the experiment "
                               f"{module}:record_experiment"), line
        assert re.search(says, line), line
    with pytest.raises(ConfigError, match="records the experiment"):
        load_config(config_files=[trained / "params.yaml"])
    assert not (trained.parent / "PAYLOAD_RAN").exists()


def test_in_the_run_directory_itself_its_code_is_not_run_either(trained, capsys, monkeypatch):
    (trained / "record_models.py").write_text(PAYLOAD)
    monkeypatch.chdir(trained)
    assert main(["eval", "-m", "."]) == 2
    assert "inside that run directory" in capsys.readouterr().err
    assert not (trained / "PAYLOAD_RAN").exists()


def test_naming_the_module_with_e_imports_it_as_the_user_asks(trained, capsys):
    recorded(trained, "os")  # a record cadence refuses: the user names the module instead
    assert main(["eval", "-m", "run", "-e", "record_models:record_experiment"]) == 0
    assert "Evaluation: accuracy=" in capsys.readouterr().out


def test_a_module_of_that_name_imported_from_elsewhere_is_refused(trained, capsys, tmp_path):
    sys.modules["record_models"].__file__ = str(tmp_path / "elsewhere" / "record_models.py")
    assert main(["eval", "-m", "run"]) == 2
    assert "record_models is already imported from" in capsys.readouterr().err


# ---------------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(("spelling", "error", "says"), [
    ("nomodels:x", ConfigError,
     r"^Experiment nomodels:x: cannot import nomodels \(ModuleNotFoundError: No module named "
     r"'nomodels'\): run the command from the folder that holds nomodels\.py \(the current "
     r"folder is importable\), or name its file: -e path/to/nomodels\.py:x\.$"),
    ("pkg.nomodels:x", ConfigError, r"from the folder that holds the package pkg"),
    ("mistakes:my_experimnt", NotRegisteredError,
     r"^Experiment mistakes:my_experimnt: mistakes has no experiment or function "
     r"'my_experimnt'\. Did you mean mistakes:my_experiment\? It registers: my_experiment; its "
     r"functions of no arguments: not_a_config, wide\. NAME must be an experiment the module "
     r"registers"),
    ("mistakes:Blobs", ConfigError,
     r"^Experiment mistakes:Blobs is the class Blobs \(a cadence\.Task\), not an experiment: "
     r"NAME must be an experiment the module registers \(@cadence\.register_experiment\) or a "
     r"function there that takes no arguments and returns a cadence\.ExperimentConfig\.$"),
    ("mistakes:with_hidden", ConfigError,
     r"is a function of arguments \(hidden\), not an experiment"),
    ("mistakes:not_a_config", ConfigError,
     r"^Experiment mistakes:not_a_config: not_a_config\(\) returned a dict; an experiment "
     r"function must return a cadence\.ExperimentConfig"),
    ("mistakes:A_CONFIG", ConfigError,
     r"is an ExperimentConfig \(wrap it: def A_CONFIG\(\): return \.\.\.\), not an experiment"),
    ("mistakes:STEPS", ConfigError, r"mistakes:STEPS is an int, not an experiment"),
    ("mistakes:torch", ConfigError, r"mistakes:torch is the module torch, not an experiment"),
    ("mistakes:", ConfigError, r"NAME is empty; name an experiment of your own as MODULE:NAME"),
    (":my_experiment", ConfigError, r"the module is empty"),
    ("my-models:x", ConfigError, r"'my-models' is neither a module name .* nor a path to a "
                                 r"\.py file"),
    ("missing.py:x", ConfigError, r"cannot import missing\.py \(no such file in .*\): pass the "
                                  r"path of a \.py file"),
    ("broken.py:x", ConfigError,
     r"^Experiment broken\.py:x: cannot import broken\.py \(RuntimeError: no GPU here, at "
     r".*broken\.py:2\): fix the module and run again\.$"),
    ("needs_lib:x", ConfigError,
     r"cannot import needs_lib \(ModuleNotFoundError: No module named 'not_installed_lib', at "
     r".*needs_lib\.py:1\): install not_installed_lib, or change the import\."),
    ("bad_syntax:x", ConfigError, r"cannot import bad_syntax \(SyntaxError: .*line 1\)"),
])
def test_a_mistake_is_one_line_that_names_it(tmp_path, monkeypatch, user_modules, spelling,
                                             error, says):
    project(tmp_path, "mistakes")
    (tmp_path / "broken.py").write_text("import os\nraise RuntimeError('no GPU here')\n")
    (tmp_path / "needs_lib.py").write_text("import not_installed_lib\n")
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as raised:
        load_config(spelling)
    message = str(raised.value)
    assert "\n" not in message and re.search(says, message), message
    assert "broken" not in sys.modules and f"{FILE_MODULE_PREFIX}broken" not in sys.modules


def test_a_failed_import_can_be_fixed_and_retried_in_the_same_process(tmp_path, monkeypatch,
                                                                      user_modules):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "retry.py").write_text("raise RuntimeError('not yet')\n")
    with pytest.raises(ConfigError, match="not yet"):
        load_config("retry.py:wide")
    project(tmp_path, "retry", "retry_experiment")
    assert load_config("retry.py:wide").experiment == "wide"


def test_an_unknown_name_says_how_to_name_an_experiment_of_one_s_own():
    with pytest.raises(NotRegisteredError, match=r"name one of your own by its module, e\.g\. "
                                                 r"mymodels:my_experiment"):
        cadence.load_config("my_experiment")


SCRIPT_MAIN = '''

if __name__ == "__main__":  # the script trains; importing it (-e) only defines its task
    config = cadence.load_config(make_config(), overrides=["trainer.train_steps=10",
                                 "trainer.steps_per_loop=5", "trainer.validation_interval=10",
                                 "trainer.best_checkpoint_eval_metric=accuracy"])
    cadence.run_experiment(config, "train_and_eval", "runs/script")
'''


@pytest.mark.slow
def test_a_run_whose_task_lives_in_the_script_that_trained_it_is_evaluated_and_exported_with_e(
        tmp_path, cadence_command):
    """A config built in a script records only its task's class (``__main__.BlobsConfig``),
    which no other process can import: ``-e path/to/script.py:NAME`` names the module, and the
    run's own config is loaded over that experiment's."""
    script = tmp_path / "train_blobs.py"
    script.write_text(USER_MODELS.format(module="train_blobs", experiment="blobs_script")
                      + SCRIPT_MAIN)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert params(tmp_path / "runs/script")["task_config_class"] == "__main__.BlobsConfig"
    refused = cadence_command(tmp_path, "eval", "-m", "runs/script", status=2)
    assert "no task is registered for in this process" in refused.stderr
    evaluated = cadence_command(tmp_path, "eval", "-m", "runs/script", "--checkpoint", "best",
                                "-e", "train_blobs.py:make_config")
    best = re.search(r"^Best export: step 10, accuracy = ([0-9.]+)", evaluated.stdout, re.M)
    assert f"Evaluation: accuracy={best.group(1)}" in evaluated.stdout
    exported = cadence_command(tmp_path, "export", "runs/script", "--out", "out", "-e",
                               "train_blobs.py:make_config")
    assert exported.stdout.startswith("Exported step 10 of runs/script/checkpoints/ckpt-10")
    assert "cannot be loaded" not in exported.stderr  # the model was built to check the names
