"""The shipped presets, installed by the wheel as the package `jobs.presets` (see
jobs/experiment/presets.py): this file only makes the folder a package."""
