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
    """And the long fuzz leaves it too (its quick run stays in): docs/fuzzing.md."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "addopts = \"--strict-markers -m 'not timing and not fuzz'\"" in pyproject
    assert "\n    \"timing:" in pyproject and "\n    \"fuzz:" in pyproject
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/pytest -q -m timing" in ci
    assert ci.index(".venv/bin/pytest -q -m timing") > ci.index(readme_commands()[1])
    assert "`timing`" in (ROOT / "README.md").read_text()


def test_the_main_job_installs_the_runtimes_its_default_config_runs():
    """The first command runs `--config default` on a fresh machine: a runtime that needs an extra is installed by it."""
    from bench.measure.runtime_auto import candidates
    from bench.measure.sweep.sweep_config import SweepConfig  # the config validates itself, runtimes included

    chosen = []

    def choose(values: dict) -> dict:  # auto's candidates are what the first command must install
        chosen.extend((*candidates("cloud"), *candidates("edge")))
        return {**values, "edge_runtime": ["llamacpp"], "cloud_runtime": ["torch-int8t"], "plain_runtimes": ["llamacpp"]}

    config = SweepConfig.from_toml("default", choose_runtimes=choose)
    runtimes = {*config.edge_runtime, *config.cloud_runtime, *config.plain_runtimes, *chosen}
    from specdec.runtime_registry import declared

    packages = [declared(r).package for r in runtimes]
    needed = sorted({p.extra.split("[")[1].split("]")[0] for p in packages if p is not None})
    assert needed == ["llamacpp", "onnx", "openvino"]  # llama.cpp, ONNX Runtime and OpenVINO are candidates of auto
    assert f"'.[{','.join(needed)}]'" in readme_commands()[0]


# -- the README is a map; docs/ holds one page per subject ---------------------------------------------

README_MAX_LINES = 250


def doc_pages() -> list[Path]:
    """The pages whose links and commands are checked: the README, CONTRIBUTING and docs/*.md."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [page for page in pages if page.exists()]


def test_readme_is_a_map_of_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to a page in docs/"


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation except '-' and '_' dropped, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a markdown page (a repeated heading gets -1, -2, ... as on GitHub)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        match = None if in_fence else re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)
        if match:
            slug = github_anchor(match.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def without_code(text: str) -> str:
    """The text outside fenced blocks and inline code, where a markdown link is a link."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_anchor_rules_match_github():
    assert github_anchor("Two commands (fresh machine, Python 3.11, no model hub needed)") == \
        "two-commands-fresh-machine-python-311-no-model-hub-needed"
    assert github_anchor("`specbench sweep`, `report`, `profile`") == "specbench-sweep-report-profile"
    assert github_anchor("A llama.cpp server (measured 2026-11-24, quiet machine)") == \
        "a-llamacpp-server-measured-2026-11-24-quiet-machine"


def test_every_relative_link_in_the_docs_points_to_a_file_and_heading_that_exist():
    broken = []
    for page in doc_pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", without_code(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading in {linked.name})")
    assert not broken, "\n".join(broken)


def bash_command_lines(page: Path) -> list[str]:
    """The command lines of a page's ```bash blocks: continuations joined, comments dropped, split at
    &&, ||, ;, | and &."""
    segments = []
    for block in re.findall(r"```bash\n(.*?)\n\s*```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*", "", line)
            segments += [s.strip() for s in re.split(r"&&|\|\||[;|&]", line) if s.strip()]
    return segments


def specbench_commands(page: Path) -> list[list[str]]:
    """Each `specbench ...` invocation in a page's bash blocks, as its words from the command name on."""
    found = []
    for segment in bash_command_lines(page):
        words = segment.split()
        for i, word in enumerate(words):
            if word == "specbench" or word.endswith("/specbench"):
                found.append(words[i + 1:])
                break
    return found


def subcommands(parser) -> dict:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_specbench_command_in_the_docs_is_one_the_cli_has_with_its_flags():
    from bench.cli import build_parser

    commands = subcommands(build_parser())
    seen, wrong = 0, []
    for page in doc_pages():
        for words in specbench_commands(page):
            where = f"{page.relative_to(ROOT)}: specbench {' '.join(words)}"
            if not words or words[0] not in commands:
                wrong.append(f"{where} (no such command; the CLI has {', '.join(sorted(commands))})")
                continue
            seen += 1
            parser = commands[words[0]]
            nested = subcommands(parser)  # `specbench models list|verify|fetch`
            if nested and len(words) > 1 and words[1] in nested:
                parser = nested[words[1]]
            flags = set(parser._option_string_actions)
            for word in words[1:]:
                if word.startswith("--") and word.split("=")[0] not in flags:
                    wrong.append(f"{where} ({word.split('=')[0]} is not a flag of `specbench {words[0]}`)")
    assert not wrong, "\n".join(wrong)
    assert seen >= 10  # the README's and the pages' examples are found at all


def test_the_flag_check_catches_a_misspelt_flag_and_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\nspecbench serve --model m --prot 1 &   # --not-checked\n"
                    "taskset -c 0 specbench run --mode spec \\\n    --k 4\nspecbench nosuch\n```\n")
    assert specbench_commands(page) == [["serve", "--model", "m", "--prot", "1"], ["run", "--mode", "spec", "--k", "4"],
                                        ["nosuch"]]
    from bench.cli import build_parser

    serve = subcommands(build_parser())["serve"]
    assert "--prot" not in serve._option_string_actions and "--port" in serve._option_string_actions


def test_the_quick_loop_leaves_out_every_marker_that_says_so():
    """CONTRIBUTING's quick loop and `tox -e quick` deselect exactly the markers whose description says
    the quick loop leaves them out, plus the real models and timing; each one has its row there."""
    import tomllib

    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    left_out = {m.split(":")[0] for m in markers if "the quick loop leaves these out" in m} | {"realmodel", "timing"}
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    quick = re.search(r'pytest -q -m "not \(([^)]*)\)"', contributing)
    assert quick, "CONTRIBUTING.md shows the quick loop as pytest -q -m \"not (a or b ...)\""
    assert set(quick.group(1).split(" or ")) == left_out
    assert f'pytest -q -m "not ({quick.group(1)})"' in (ROOT / "tox.ini").read_text()
    assert all(f"| `{marker}` |" in contributing for marker in left_out)


def test_a_test_module_that_starts_servers_or_processes_is_marked():
    """A module whose tests start a server or child processes carries a quick-loop marker somewhere
    (its `pytestmark` or a test's decorator), so the quick loop stays in one process."""
    starts = ("BackgroundServer(", "ServerProcess(", "subprocess.run(", "subprocess.Popen(", "ray.init(")
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        if path.name == "test_repo.py":  # names what it looks for
            continue
        if any(s in text for s in starts) and not re.search(r"pytest\.mark\.(server|subprocess|cluster|realmodel|slow)", text):
            unmarked.append(path.name)
    assert not unmarked, f"mark these (see CONTRIBUTING.md, Which tests to run when): {unmarked}"


def test_ci_runs_the_soaks_one_minute_version_and_the_other_benchmarks_leave_it_out():
    """The soak (marker `soak`, bench/test_bench_soak.py) is not in the default suite; CI runs its
    tiny 1-minute version on a line of its own (docs/soak.md)."""
    assert "\n    \"soak:" in (ROOT / "pyproject.toml").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any("bench/test_bench_soak.py" in line and '-m "soak and not realmodel"' in line for line in ci)
    assert any(line.startswith(".venv/bin/pytest bench --benchmark-only") and "not soak" in line for line in ci)


def test_every_test_the_guarantees_name_exists_and_each_section_is_linked_from_the_readme():
    page = (ROOT / "docs" / "guarantees.md").read_text()
    named = set(re.findall(r"`(tests/test_\w+\.py)`", page))
    assert len(named) >= 20
    assert not [name for name in sorted(named) if not (ROOT / name).exists()]
    sections = {github_anchor(h) for h in re.findall(r"^## (.+)$", page, flags=re.M)}
    linked = set(re.findall(r"\(docs/guarantees\.md#([\w-]+)\)", (ROOT / "README.md").read_text()))
    assert sections == linked


MAX_PARAMETERS = 8


def test_no_function_in_specdec_or_bench_takes_more_than_8_parameters():
    """Past 8 (self and cls not counted), the parameters that belong together go into one settings object."""
    import ast

    over = []
    for path in sorted([*(ROOT / "specdec").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
                if names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                if len(names) > MAX_PARAMETERS:
                    over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({len(names)})")
    assert not over, f"more than {MAX_PARAMETERS} parameters: group them (a settings dataclass) or drop one:\n" + \
        "\n".join(over)
