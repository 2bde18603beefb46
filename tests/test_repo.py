"""The README's commands are the ones that CI and users run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_opens_with_the_main_job_and_the_test_command():
    commands = readme_commands()
    assert len(commands) >= 2
    assert "specbench" in commands[0] and "pip install" in commands[0]
    assert "pytest" in commands[1] and "pip install" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci.splitlines()


def test_timing_tests_leave_the_default_run_and_ci_runs_them_on_their_own():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "addopts = \"-m 'not timing'\"" in pyproject and "\n    \"timing:" in pyproject
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/pytest -q -m timing" in ci
    assert ci.index(".venv/bin/pytest -q -m timing") > ci.index(readme_commands()[1])
    assert "`timing`" in (ROOT / "README.md").read_text()


def test_the_main_job_installs_the_runtimes_its_default_config_runs():
    """The first command runs `--config default` on a fresh machine: a runtime that needs an extra is installed by it."""
    from bench.measure.sweep_config import SweepConfig  # the config validates itself, runtimes included

    config = SweepConfig.from_toml("default")
    runtimes = {*config.edge_runtime, *config.cloud_runtime, *config.plain_runtimes}
    assert ("llamacpp" in runtimes) == ("'.[llamacpp]'" in readme_commands()[0])
