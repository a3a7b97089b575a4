"""Train one LoRA adapter from a file of `{prompt, completion}` rows.

    python -m train --model PATH --data rows.jsonl --output DIR \
        [--config configs/tiny.yaml --section teacher] [--set lr=1e-3 --set num_workers=1]

The settings come from a section of a preset (default: the `teacher` section of
configs/tiny.yaml) or, with `--section ''`, from the file's top level; `--set`
overrides single keys (see train/config.py for all of them). It joins the Ray
cluster in $RAY_ADDRESS or starts a local one. Re-running the same command after
an interruption continues from the latest checkpoint (same output folder name).
"""

import argparse
import json
import sys

from common.files import DataError
from train.config import ConfigError, TrainConfig, apply_overrides, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="base model: local folder or hub id")
    parser.add_argument("--data", required=True, help="JSONL or parquet file of {prompt, completion} rows")
    parser.add_argument("--output", required=True, help="adapter folder to create (must not exist)")
    parser.add_argument("--config", default=None, help="YAML preset: a path or a shipped preset's name (default: tiny)")
    parser.add_argument("--section", default="teacher", help="section of the preset to use ('' = top level)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--storage", default=None, help="Ray Train storage path (default: beside --output)")
    args = parser.parse_args(argv)
    try:
        from jobs.experiment.presets import load_preset

        data = load_preset(args.config)[0]
        if args.section:
            data = data.get(args.section) or {}
        cfg = build(TrainConfig, apply_overrides(data, args.overrides), args.section)
        from train.trainer import train_lora

        metrics = train_lora(args.model, args.data, args.output, cfg, storage_path=args.storage)
    except (ConfigError, DataError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(metrics, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
