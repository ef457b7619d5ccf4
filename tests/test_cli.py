"""The command line is generated from the stages' config dataclasses: every field an option with
its help, recipes for every command, both spellings of an option, unknown keys refused."""

from __future__ import annotations

import re
import signal
from contextlib import nullcontext
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from grail.benchmark.config import BenchmarkConfig
from grail.cli import COMMANDS, main
from grail.core.config import parse_config
from grail.core.errors import GrailError
from grail.tasks.slate.prompts import PromptOptions

GENERATED = [name for name, command in COMMANDS.items() if command.configs]


@pytest.mark.parametrize("name", GENERATED)
def test_every_field_is_an_option_with_help_and_its_default(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for kind in COMMANDS[name].types():
        for field in fields(kind):
            assert field.metadata.get("help"), f"{kind.__name__}.{field.name} has no help"
            assert f"--{field.name}" in text, field.name
            if field.default not in (MISSING, None, False):
                assert f"(default: {field.default})" in text, field.name
    assert "--config RECIPE" in text


def test_both_spellings_and_a_recipe_with_the_command_line_on_top(tmp_path):
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("data: d\nout: o\nbatch_size: 4\nhistory_depth: 2\nmodels: [m1]\n")
    types = (BenchmarkConfig, PromptOptions)
    argv = ["--config", str(recipe), "--batch-size", "8", "--max_new_tokens", "5", "--model", "m2"]
    (config, prompt), given = parse_config(types, argv, "grail benchmark")
    assert (config.data, config.batch_size, config.max_new_tokens) == ("d", 8, 5)
    assert config.models == ["m1", "m2"] and prompt.history_depth == 2
    assert {"batch_size", "history_depth", "max_new_tokens", "models"} <= given
    assert "show_ids" not in given  # left as trained by benchmark


def test_repeated_list_options_accumulate():
    argv = ["--data", "d", "--out", "o", "--model", "a", "--model", "b", "--reference", "ranker"]
    (config, _), _ = parse_config((BenchmarkConfig, PromptOptions), argv, "grail benchmark")
    assert config.models == ["a", "b"] and config.references == ["ranker"]


def test_an_unknown_recipe_key_or_option_names_it(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("data: d\nout: o\nbatch_sise: 4\n")
    with pytest.raises(GrailError, match="unknown recipe key 'batch_sise'"):
        parse_config((BenchmarkConfig, PromptOptions), ["--config", str(recipe)], "grail b")
    assert main(["generate", "--config", str(recipe)]) == 2
    assert "batch_sise" in capsys.readouterr().err
    assert main(["clean", "--raw", "r", "--out", "o", "--no-such-option", "1"]) == 2
    assert "unknown option '--no-such-option'" in capsys.readouterr().err


def test_a_wrong_kind_of_value_in_a_recipe_is_refused(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("data: d\nout: o\nlimit: [1, 2]\n")
    with pytest.raises(GrailError, match="limit: \\[1, 2\\] is not a valid value"):
        parse_config((BenchmarkConfig, PromptOptions), ["--config", str(recipe)], "grail b")


@pytest.mark.parametrize(
    "line", ["max_steps: true", "max_steps: 2.7", "per_device_train_batch_size: 4.0"]
)
def test_an_integer_field_takes_a_whole_number_before_anything_is_written(tmp_path, capsys, line):
    """YAML's ``true`` is no step count (it trained 1 step), and 2.7 or 4.0 failed inside
    transformers or TRL after output_dir was claimed: one line naming the key, nothing made."""
    from grail.core.recipes import read_recipe
    from grail.train.config import check_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"{line}\n")
    key = line.split(":")[0]
    with pytest.raises(GrailError, match=f"r.yaml: {key}: .* is not a valid value"):
        check_recipe(read_recipe(recipe), str(recipe))
    out = tmp_path / "out"
    assert main(["train", "--config", str(recipe), "--output_dir", str(out)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert key in err and not out.exists()


@pytest.mark.parametrize(
    "argv, option",
    [
        (["compare", "--result", "a", "--out", "o", "--bootstrap", "0"], "bootstrap"),
        (["compare", "--result", "a", "--out", "o", "--bootstrap", "-5"], "bootstrap"),
        (["benchmark", "--data", "d", "--out", "o", "--batch_size", "0"], "batch_size"),
        (["benchmark", "--data", "d", "--out", "o", "--max_new_tokens", "0"], "max_new_tokens"),
        (["benchmark", "--data", "d", "--out", "o", "--concurrency", "0"], "concurrency"),
    ],
)
def test_a_count_below_one_is_one_line(tmp_path, monkeypatch, capsys, argv, option):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"{option}: expected at least 1, got {argv[-1]}" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["simulate", "--out", "o", "--seed", "-1"], "seed: expected 0 or more, got -1"),
        (["clean", "--raw", "r", "--out", "o", "--seed", "-1"], "seed: expected 0 or more"),
        (
            ["clean", "--raw", "r", "--out", "o", "--document_split_seed", "-1"],
            "document_split_seed: expected 0 or more, got -1",
        ),
        (["clean", "--config", "bad.yaml"], "bad.yaml: not UTF-8 text (byte 6 is 0xff)"),
    ],
)
def test_a_negative_seed_or_a_recipe_not_utf8_is_one_line(tmp_path, monkeypatch, capsys, argv,
                                                           words):  # fmt: skip
    """NumPy takes no negative seed, and a recipe in another encoding failed in its decoder:
    each a traceback after the command had started."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(b"data: \xff\n")
    assert main(argv) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert words in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["simulate", "export"])
@pytest.mark.parametrize("out", ["~", "~/grail-out"])
def test_an_output_path_with_an_unexpanded_tilde_is_one_line(
    tmp_path, monkeypatch, capsys, out, command
):
    """``--out '~'`` (quoted: no shell expands it) made a folder named ``~`` in the current
    folder, where ``rm -rf ~`` would be one typo from the home folder; ``export --dest '~/x'``
    still did (probe B8)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argv = ["simulate", "--out", out, "--participants", "20"]
    if command == "export":
        argv = ["export", "--model", str(Path(__file__).parent), "--dest", out]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "starts with '~', which no shell expanded" in line
    assert list(tmp_path.iterdir()) == []


def test_one_value_for_a_list_field_is_a_list_of_one(tmp_path):
    """A recipe's ``reward_funcs: log_score`` or ``models: m1`` was kept a string and read as
    its characters (``unknown reward 'l'``); it is a list of one, as on the command line."""
    from grail.train.config import parse_train_args

    recipe = tmp_path / "bench.yaml"
    recipe.write_text("data: d\nout: o\nmodels: m1\nreferences: ref\n")
    (config,), _ = parse_config((BenchmarkConfig,), ["--config", str(recipe)], "grail b")
    assert config.models == ["m1"] and config.references == ["ref"]
    tiny = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "config_grpo.yaml"
    lines = [line for line in tiny.read_text().splitlines() if not line.startswith("reward_")]
    recipe.write_text("\n".join([*lines, "reward_funcs: log_score", "reward_weights: 1.0"]))
    config, _ = parse_train_args(["--config", str(recipe)])
    assert config.reward_funcs == ["log_score"] and config.reward_weights == [1.0]


def test_positional_arguments_still_work(default_clean, capsys):
    assert main(["audit", str(default_clean)]) == 0
    assert "# Data audit" in capsys.readouterr().out
    assert main(["prompt", "--row", "1", str(default_clean), "--opinion"]) == 0
    assert "<opinion>" in capsys.readouterr().out
    assert main(["audit"]) == 2
    assert "required: path" in capsys.readouterr().err


def test_prompt_of_a_training_recipe_is_the_prompt_training_builds(default_clean, capsys):
    """``grail prompt --config`` a shipped training recipe (refused as 'unknown recipe key
    model_name_or_path (and 31 more)' before): row 2 of the train split, asked with the
    recipe's system prompt and history depth, is the text of training's own example 2."""
    from pathlib import Path

    from grail.tasks.slate.examples import examples
    from grail.train.config import parse_train_args

    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "config_grpo.yaml")
    argv = ["prompt", str(default_clean), "--config", recipe, "--split", "train", "--row=2"]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    config, _ = parse_train_args(["--config", recipe, "--dataset", str(default_clean)])
    system, user = examples(config, default_clean, "train", 3)[2]["prompt"]
    assert shown.startswith(
        f"=== system ===\n{system['content']}\n\n=== user ===\n{user['content']}\n"
    )
    assert config.history_depth == 1 and user["content"].count("watched ") <= 1
    assert main(["prompt", str(default_clean), "--config", recipe, "--max_stepz", "3"]) == 2
    assert "unknown option '--max_stepz'" in capsys.readouterr().err


def test_the_shipped_benchmark_recipe_parses():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "benchmark" / "tiny.yaml"
    (config, prompt), _ = parse_config(
        (BenchmarkConfig, PromptOptions), ["--config", str(recipe)], "grail benchmark"
    )
    assert config.models == ["demo_outputs/tiny-model"] and prompt.history_depth == 3


@pytest.mark.parametrize(
    "argv, option",
    [
        (["simulate", "--out", "o", "--particip", "3"], "--particip"),
        (["run", "--local", "--max-step", "3"], "--max-step"),
        (["train", "--config", "recipes/tiny/config_grpo.yaml", "--learning_rat", "1e-3"], None),
    ],
)
def test_no_option_is_matched_by_its_prefix(argv, option, capsys):
    """argparse accepts an unambiguous prefix of an option by default (allow_abbrev): an
    abbreviation is an unknown option here, as an unknown key in a recipe is."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown option '{option or argv[-2]}'" in err, err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "--local", "--max-steps", "3.5"], ("--max_steps", "expected int", "'3.5'")),
        (["simulate", "--out", "o", "--participants", "many"], ("--participants", "int", "many")),
        # argparse's int() read these as 60, 3 and 60 (probe B6)
        (["simulate", "--out", "o", "--participants", "６０"], ("--participants", "expected int")),
        (["prompt", "d", "--row", "٣"], ("--row", "'٣'", "ASCII digits")),
        (["simulate", "--out", "o", "--participants=6_0"], ("--participants", "'6_0'")),
        # ran 10 minutes into 3.7 GB before it was killed (probe B11)
        (["simulate", "--out", "o", "--participants", "9" * 23], ("participants", "at most")),
        (["run", "--local", "--runner", "ssh"], ("--runner", "'ssh'", "subprocess")),
        (
            ["benchmark", "--data", "d", "--out", "o", "--show-ids", "maybe"],
            ("--show_ids", "maybe", "true/false"),
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option_value_and_kind(argv, words, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "usage:" not in captured.err + captured.out
    assert all(word in captured.err for word in words), captured.err


@pytest.mark.parametrize(
    "line",
    ["max_train_rows: true", "max_eval_rows: 1.5", "shuffle_seed: true", "max_train_rows: x"],
)
def test_an_optional_int_in_a_recipe_is_an_int(tmp_path, line):
    """``max_train_rows: true`` trained 0 steps with rc 0 and ``shuffle_seed: true`` went into
    prompt.json (probe B7): an optional int field took anything but None."""
    from grail.train.config import parse_train_args

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"{line}\n")
    with pytest.raises(GrailError, match=f"{line.split(':')[0]}: .* is not a valid value"):
        parse_train_args(["--config", str(recipe)])


@pytest.mark.parametrize("name", [*COMMANDS])
def test_help_text_is_clean(name, capsys):
    """No Markdown backticks, no "(default: None)" after a text naming its own default, no
    placeholder for a list default; a required option says so."""
    with pytest.raises(SystemExit) if name != "train" else nullcontext():
        main([name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for bad in ("`", "(default: None)", "(list)"):
        assert bad not in text, (name, bad)
    assert not re.search(r"\(default[^)]*\)\.? \(default", text), name  # said twice
    if name == "submit":
        assert "KFP API endpoint URL. (required)" in " ".join(text.split())


@pytest.mark.parametrize("recipe", [None, "recipes/tiny/config_grpo.yaml"])
def test_train_s_whole_help_prints_with_or_without_a_recipe(recipe, capsys):
    """Before: `grail train --help-all` and `grail train --config RECIPE --help` stopped with
    "%o format: an integer is required, not dict": the help of rl_signal_guard says "95% of",
    which argparse read as a conversion."""
    from pathlib import Path

    from grail.train.stage import main as train_main

    config = ["--config", str(Path(__file__).parents[1] / recipe)] if recipe else []
    with pytest.raises(SystemExit) as done:
        train_main([*config, "--help"] if recipe else ["--help-all"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "at least 95 percent of" in text and "--rl_signal_guard" in text


@pytest.mark.parametrize("name", GENERATED)
def test_no_option_s_help_holds_a_bare_percent_sign(name):
    """argparse formats every help with %, so a bare "%" ("95% of" reads as "% o") stops the
    whole help: say "percent", or "%%" where argparse's own expansion is meant."""
    for kind in COMMANDS[name].types():
        for field in fields(kind):
            bare = re.search(r"%(?![%(])", field.metadata.get("help", ""))
            assert bare is None, f"{kind.__name__}.{field.name}: a bare % in its help"


def test_train_help_imports_neither_trl_nor_torch():
    """`grail train --help` lists grail's fields without importing TRL, transformers or torch
    (seconds each); the fields come from grail.train.fields."""
    import subprocess
    import sys

    code = (
        "import sys; from grail.cli import main; main(['train', '--help']); "
        "print(sorted(m for m in ('trl', 'transformers', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-500:]
    assert "--gail_replay_size (default 4096)" in done.stdout
    assert "--reward_funcs (default None)" in done.stdout
    # each task's rewards by name, with what each is optimal at; the default a proper one
    assert "  slate (default log_score, format):" in done.stdout
    assert "    accuracy: 1 when the sampled answer is the person's choice (mode-seeking" in (
        done.stdout
    )
    assert "  summarize (default answered, summary_format):" in done.stdout


def test_a_tiny_recipe_without_its_assets_names_make_tiny_assets(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    recipe = Path(__file__).parents[1] / "recipes" / "tiny" / "config_grpo.yaml"
    monkeypatch.chdir(tmp_path)  # no demo_outputs/ here
    assert main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "grail: error: dataset demo_outputs/clean does not exist: make tiny-assets builds what "
        "the tiny recipes name\n"
    )


def test_shipped_recipes_are_found_from_any_folder_and_a_local_file_wins(tmp_path, monkeypatch):
    """Recipes are package data (grail.recipes): `recipes/tiny/...` works outside a checkout,
    and a file of that name in the working directory is used instead when there is one."""
    from grail.core.recipes import find_recipe, read_recipe

    monkeypatch.chdir(tmp_path)
    shipped = find_recipe("recipes/tiny/config_grpo.yaml")
    assert shipped.is_file() and shipped.parent.parent.name == "recipes"
    assert read_recipe("recipes/tiny/config_grpo.yaml") == read_recipe(shipped)
    mine = tmp_path / "recipes" / "tiny" / "config_grpo.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("max_steps: 3\n")
    assert read_recipe("recipes/tiny/config_grpo.yaml") == {"max_steps": 3}
    with pytest.raises(GrailError, match="recipes/none.yaml: recipe not found"):
        find_recipe("recipes/none.yaml")


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--run-name", "../../../escape2", "--run-name '../../../escape2': give a run id"),
        ("--export-destination", "s3://exp/a/../../b", "a '..' segment in the key is refused"),
    ],
)
def test_a_local_run_checks_its_name_and_destination_before_anything(
    option, value, words, tmp_path, capsys
):
    """The probe's `--run-name '../../../escape2'` wrote the pipeline root outside the outputs
    folder and was refused only at the export task: now one line before the DAG starts."""
    outputs = tmp_path / "outputs"
    assert main(["run", "--local", "--outputs", str(outputs), option, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not outputs.exists() and not (tmp_path / "escape2").exists()


# A forked worker of a command (distilabel's pool, multiprocessing's) with a second thread, its
# main thread blocked in a lock as a pool worker waits on its task queue. The kernel hands a
# process's SIGTERM to any thread that does not block it; blocking it in the main thread makes
# the unlucky draw certain. Prints the child's fate.
_FORKED_WORKER = """
import os, signal, sys, threading, time
from grail import cli
signal.signal(signal.SIGTERM, cli._stop)  # what grail.cli.main installs
ready, say = os.pipe()
pid = os.fork()
if pid == 0:
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    lock = threading.Lock()
    lock.acquire()
    os.write(say, b"1")
    lock.acquire()
    os._exit(0)
os.read(ready, 1)
os.kill(pid, signal.SIGTERM)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("killed by", os.WTERMSIG(status) if os.WIFSIGNALED(status) else "exit")
        sys.exit(0)
    time.sleep(0.05)
os.kill(pid, signal.SIGKILL)
print("still alive 10 s after SIGTERM")
"""


def test_a_forked_worker_dies_of_sigterm_whichever_thread_receives_it():
    """The command's SIGTERM handler (unwind like an error) stays in the command's process: a
    forked child gets the default back, or a pool's terminate waits forever on a worker whose
    signal went to a thread that cannot run Python's handler (`grail generate` hung in
    distilabel's teardown 1 run in 12 against a vLLM server)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FORKED_WORKER], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"killed by {int(signal.SIGTERM)}"


def test_a_local_run_never_writes_into_someone_s_folder(tmp_path, capsys):
    """The re-probe: `grail run --local --outputs <a user's folder>` appended to the user's
    pipeline.log and wrote its MLflow store and pipeline root there, inside an export and
    through a link too. Its --outputs is empty, or one an earlier run used."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text('{"files": {}}')
    for outputs, words in (
        (mine, "holds files and no pipeline.log of an earlier grail run"),
        (tmp_path / "link", "is a symbolic link"),
        (export / "runs", "is inside an export"),
    ):
        assert main(["run", "--local", "--outputs", str(outputs)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "empty").exists() and not (export / "runs").exists()
