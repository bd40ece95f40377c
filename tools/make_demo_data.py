#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Build the demo Energon dataset (``make demo-data``): see :mod:`megatron.mllm.demo_data`.

Usage: ``python tools/make_demo_data.py [DIR] [--num-samples N] [--seed S]`` (DIR: demo-data).
"""

import argparse
import contextlib
import io
import shutil
import sys

from megatron.mllm.demo_data import DemoSpec, build_demo_dataset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Build the demo Energon dataset.")
    p.add_argument("directory", nargs="?", default="demo-data", help="default demo-data")
    p.add_argument("--num-samples", type=int, default=DemoSpec.num_samples)
    p.add_argument("--seed", type=int, default=DemoSpec.seed)
    args = p.parse_args(argv)
    if args.num_samples < 1:
        sys.stderr.write("error: --num-samples must be >= 1\n")
        return 2
    shutil.rmtree(args.directory, ignore_errors=True)  # a rebuild leaves no stale shard
    with contextlib.redirect_stdout(io.StringIO()):  # Energon's preparator prints progress
        tok = build_demo_dataset(args.directory, DemoSpec(args.num_samples, seed=args.seed))
    print(f"wrote {args.num_samples} samples to {args.directory} (tokenizer: {tok})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
