"""Every command line of the project ends a config error with exit 2 and one line naming it."""

from pathlib import Path

import pytest

from jobs import pipeline
from jobs.sizing import memory_plan, wall_time
from train import __main__ as train_cli

BAD = {
    "missing preset": (["--config", "nowhere"], "nowhere does not exist"),
    "unknown key": (
        ["--config", "tiny", "--set", "teacher.learning_rate=1"],
        "unknown config key teacher.learning_rate",
    ),
    "wrong type": (["--config", "tiny", "--set", "teacher.epochs=many"], "teacher.epochs"),
    "malformed value": (
        ["--config", "tiny", "--set", "teacher.lora_targets=[q_proj"],
        "lora_targets=[q_proj': the value is not valid YAML",
    ),
    "malformed preset": (["--config", "broken.yaml"], "broken.yaml is not valid YAML: "),
}
PRESETS = Path(__file__).resolve().parents[2] / "configs"
TRAIN_ARGS = ["--model", "m", "--data", "d.jsonl", "--output", "out"]
COMMANDS = {
    "pipeline": (pipeline.main, ["--plan"]),
    "memory_plan": (memory_plan.main, []),
    "wall_time": (wall_time.main, []),
    "train": (train_cli.main, TRAIN_ARGS),
}


@pytest.mark.parametrize("problem", BAD)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_config_error_exits_2_with_one_line(command, problem, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.yaml").write_text("name: broken\nteacher: {lr: 0.1\n")  # a mapping never closed
    main, extra = COMMANDS[command]
    args, named = BAD[problem]
    # a preset file, not a name (python -m train imports no experiment); its --set names keys of the one section it reads (teacher)
    if command == "train":
        args = [str(PRESETS / f"{a}.yaml") if a == "tiny" else a.removeprefix("teacher.") for a in args]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and named in err


def test_the_sizing_commands_count_the_same_gpus_by_default(capsys):
    assert wall_time.main(["--config", "llama-8b"]) == 0
    assert "on 1 GPU(s)" in capsys.readouterr().out
    assert memory_plan.main(["--config", "llama-8b"]) == 0
    assert "teacher: 1 x ddp" in capsys.readouterr().out


def test_a_model_without_a_known_shape_is_a_config_error(capsys):
    assert memory_plan.main(["--config", "tiny", "--set", "model.path=/no/such/model"]) == 2
    assert "no shape for /no/such/model: pass --model-config" in capsys.readouterr().err
