"""Train one LoRA adapter from a file of `{prompt, completion}` rows.

    python -m train --model PATH --data rows.jsonl --output DIR \
        [--config configs/tiny.yaml --section teacher] [--set lr=1e-3 --set num_workers=1]

The settings come from a section of a YAML file (a preset's `teacher` section by default, the
files it `extends` merged under it) or, with `--section ''`, from the file's top level; without
--config, train/config.py's defaults. `--set` overrides single keys (see train/config.py for all
of them). It joins the Ray
cluster in $RAY_ADDRESS or starts a local one. Re-running the same command after
an interruption continues from the latest checkpoint (same output folder name).
"""

import argparse
import json
import sys
from pathlib import Path

from common.config import ConfigError, apply_overrides, build, load_layered
from common.files import DataError
from train.config import TrainConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="base model: local folder or hub id")
    parser.add_argument("--data", required=True, help="JSONL or parquet file of {prompt, completion} rows")
    parser.add_argument("--output", required=True, help="adapter folder to create (must not exist)")
    parser.add_argument(
        "--config", default=None, help="YAML file, e.g. configs/tiny.yaml (default: train/config.py's defaults)"
    )
    parser.add_argument("--section", default="teacher", help="section of the preset to use ('' = top level)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--storage", default=None, help="Ray Train storage path (default: beside --output)")
    args = parser.parse_args(argv)
    try:
        data = load_layered(Path(args.config).expanduser())[0] if args.config else {}
        if args.section:
            data = data.get(args.section) or {}
        cfg = build(TrainConfig, apply_overrides(data, args.overrides), args.section)
        from train.trainer import train_lora

        result = train_lora(args.model, args.data, args.output, cfg, storage_path=args.storage)
    except (ConfigError, DataError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.metrics(), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
