"""ONNX Runtime against torch inference on this CPU, side by side, on one exported encoder.

Exports the encoder with ``contrastive-export --format onnx``'s function (checked against torch
on the way), then times both on the same fixed batch in alternating rounds (A B A B ...):
torch eager under ``torch.inference_mode`` and ONNX Runtime's CPU provider, each at the same
thread count; prints images per second (median of the rounds) with the CPU kind, and the
largest absolute difference between the two on that batch.

Usage:
    python benchmarks/bench_onnx.py [--encoder cifar_resnet18] [--image-size 32]
        [--batch-size 64] [--rounds 5] [--threads N] [--checkpoint PATH] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from contrastive.eval.export_onnx import export_onnx, require_onnx
from contrastive.hardware import cpu_kind, cpu_kind_line
from contrastive.nn import create_encoder
from contrastive.records import EncoderRecord


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoder", default="cifar_resnet18",
                   help="a create_encoder name (random weights) when --checkpoint is not given")
    p.add_argument("--checkpoint", default=None, help="any checkpoint contrastive-export reads")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="threads of both (torch.set_num_threads, ORT intra_op_num_threads)")
    p.add_argument("--out", default=None, help="append the result as one JSON line")
    args = p.parse_args()
    ort = require_onnx()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None:
            torch.manual_seed(0)
            checkpoint = str(Path(tmp) / "encoder.pt")
            EncoderRecord.from_module(create_encoder(args.encoder), args.encoder,
                                      image_size=args.image_size).save(checkpoint)
        path = Path(tmp) / "model.onnx"
        t0 = time.perf_counter()
        result = export_onnx(checkpoint, path, image_size=args.image_size)
        export_s = time.perf_counter() - t0
        from contrastive.eval.checkpoint import load_encoder

        model = load_encoder(checkpoint).encoder.eval()
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                    generator=torch.Generator().manual_seed(0))
    feed = {"image": x.numpy()}

    def run_torch() -> torch.Tensor:
        with torch.inference_mode():
            return model(x)

    def run_ort() -> torch.Tensor:
        return torch.from_numpy(session.run(["features"], feed)[0])

    contenders = {"torch eager (inference_mode)": run_torch, "ONNX Runtime (CPU provider)": run_ort}
    for fn in contenders.values():  # warm-up: allocations, ORT's first-run graph work
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    diff = float((run_torch() - run_ort()).abs().max())
    print(f"{cpu_kind_line()}; threads {args.threads}")
    print(f"export + check {export_s:.1f} s ({result.checked_on}: {result.max_abs_diff:.2g})")
    rates = {}
    for name, ts in times.items():
        rates[name] = args.batch_size / statistics.median(ts)
        print(f"  {name:32s} {rates[name]:9.1f} images/s  (median of {args.rounds} rounds of "
              f"{args.batch_size} at {args.image_size} px)")
    print(f"largest absolute difference on the batch: {diff:.3g}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"bench": "onnx", "encoder": args.checkpoint or args.encoder,
                                "image_size": args.image_size, "batch_size": args.batch_size,
                                "rounds": args.rounds, "threads": args.threads,
                                "images_per_s": rates, "max_abs_diff": diff,
                                "cpu": cpu_kind()}) + "\n")


if __name__ == "__main__":
    main()
