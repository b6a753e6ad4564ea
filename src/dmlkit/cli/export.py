"""``dmlkit export RUN_DIR --format torchscript|onnx``: write a standalone embedding model."""

from __future__ import annotations

import argparse


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Write the run's embedding model (selected weights, eval mode) as a standalone TorchScript or\n"
        "ONNX file with a dynamic batch axis, and check it against the original on a probe batch.\n\n"
        "Input: [B, C, H, W] float32 images preprocessed like the run's data pipeline; with\n"
        "--include-preprocessing the model's mean/std normalisation (and RGB->BGR order) is in the\n"
        "graph and the input is raw images in [0, 1]; either way at the size the run evaluated at\n"
        "(its manifest.json eval_input, not the model's nominal input size). FILE.json beside the\n"
        "file records the input contract, the preprocessing config and the source run.\n\n"
        "ONNX is written by PyTorch's current exporter (dynamo, opset 18) when onnxscript is installed\n"
        '(pip install "dmlkit[onnx]"), else by the deprecated TorchScript-based one (opset 17), with a\n'
        "warning saying why; FILE.json records which (onnx_exporter)."
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    p.add_argument("--format", dest="fmt", choices=["torchscript", "onnx"], default="torchscript",
                   help="file format (default: torchscript)")
    p.add_argument("--out", metavar="FILE",
                   help="output file, new or written by an earlier export (default: RUN_DIR/export/embedder.pt or "
                   "RUN_DIR/export/embedder.onnx)")
    p.add_argument("--checkpoint", choices=["best", "last"], default="best", help="which weights (default: best)")
    p.add_argument("--include-preprocessing", action="store_true",
                   help="put the normalisation in the graph; the input is then raw images in [0, 1]")
    p.add_argument("--atol", type=float, default=1e-4,
                   help="largest allowed embedding difference on the probe batch (default: 1e-4)")


def run(args: argparse.Namespace) -> int:
    from dmlkit.cli.common import check_output_file
    from dmlkit.export import default_export_path, export_model, metadata_path_for

    out = check_output_file(args.out or default_export_path(args.run_dir, args.fmt), "--out",
                            replaceable=lambda p: metadata_path_for(p).is_file(),
                            what="a model written by `dmlkit export` (no FILE.json beside it)")
    result = export_model(
        args.run_dir,
        args.fmt,
        out,
        checkpoint=args.checkpoint,
        include_preprocessing=args.include_preprocessing,
        atol=args.atol,
    )
    exporter = f" (the {result.onnx_exporter} exporter)" if result.onnx_exporter else ""
    print(f"wrote {result.format}{exporter}: {result.path}")
    kind = "raw images in [0, 1]" if result.include_preprocessing else "preprocessed images"
    print(f"input: {list(result.input_shape)} float32 ({kind}); metadata: {result.metadata_path}")
    if result.max_abs_difference is None:
        print("check: skipped (onnxruntime is not installed)")
    else:
        print(f"check: largest embedding difference on a probe batch {result.max_abs_difference:.2e}")
    return 0
