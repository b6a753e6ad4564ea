"""Write docs/cli/<verb>.md from the parser's help plus the examples below (keeps the pages true).

Run: .venv/bin/python scripts/gen_cli_docs.py   (tests/integration/test_cli_docs.py checks they are current)
"""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = {
    "train": [
        "dmlkit train                                   # the main job: MNIST-5k zero-shot, Proxy-Anchor",
        "dmlkit train --preset cpu-asap-mnist-2d-c2     # a packaged preset",
        "dmlkit train --set loss.name=multi_similarity --set loss.miner.name=multi_similarity --out runs/ms",
        "dmlkit train --resume runs/ms                  # continue an interrupted run exactly",
        "dmlkit train --plan runs/ms --dry-run          # what replaying runs/ms's plan trains (docs/recipes.md)",
        "dmlkit train --list-backbones                  # which backbones have weights here, and why not",
    ],
    "validate": ["dmlkit validate --preset cpu-asap-mnist-2d-c2 --set train.max_steps=300 --print"],
    "evaluate": ["dmlkit evaluate runs/ms", "dmlkit evaluate runs/ms --split val --set protocol.val_fraction=0.2"],
    "crossval": ["dmlkit crossval --set protocol.val_fraction=0 --seeds 0 1 2 --out runs/cv"],
    "embed": ["dmlkit embed runs/ms --split test --out test.npz"],
    "search": [
        "dmlkit search --gallery test.npz --query-embeddings queries.npz -k 5",
        "dmlkit search --gallery gallery.npz --run runs/ms query1.png query2.png",
        "dmlkit search --index qdrant:pets.qdrant ../shared/data/pets/images/Abyssinian/Abyssinian_12.jpg -k 5"
        "   # written by `dmlkit index export`",
    ],
    "presets": ["dmlkit presets", "dmlkit presets show mnist-proxy-anchor"],
    "datasets": ["dmlkit datasets list"],
    "report": ["dmlkit report runs/ms", "dmlkit report runs/ms --no-proxies   # the map without training-class proxies"],
    "sweep": [
        "dmlkit sweep --set protocol.val_fraction=0.2 --param loss.args.margin=float:0.01:0.5:log --trials 20 --out runs/sweep",
        "dmlkit train --from-sweep runs/sweep            # rerun the best trial",
    ],
    "export": ["dmlkit export runs/ms --format onnx --out model.onnx"],
    "index": [
        "dmlkit index build runs/pets --images ../shared/data/pets/images --out pets.index --threshold-fmr 1e-3",
        "dmlkit index add pets.index --images ../shared/data/pets/images/Bengal",
        "dmlkit index query pets.index ../shared/data/pets/images/Abyssinian/Abyssinian_12.jpg -k 5",
        "dmlkit index query pets.index ../shared/data/pets/images/Abyssinian/Abyssinian_12.jpg --json --k-reciprocal",
        "dmlkit index classify pets.index ../shared/data/pets/images/Abyssinian/Abyssinian_12.jpg -k 5",
        "dmlkit index remove pets.index 0 1",
        "dmlkit index export pets.index --to qdrant:pets.qdrant        # Qdrant's local mode; http://HOST:6333 for a server",
    ],
    "compare": ["dmlkit compare runs/ms runs/pa --out comparison.html"],
    "push": [
        "dmlkit push runs/ms me/ms-embedder              # after `hf auth login`; then dmlkit.load(\"hf://me/ms-embedder\")",
        "dmlkit push runs/ms me/ms-embedder --local shared-ms   # the repository's files, to read before uploading",
    ],
}


#: A sentence before a verb's examples, for examples that build on another page's run.
EXAMPLE_INTROS = {
    "index": "On the Pets run `runs/pets` trained in [deploying.md](../deploying.md) (`dmlkit train --set "
             "data.name=folder --set data.root=../shared/data/pets/images --out runs/pets`):",
}

#: Examples that need what a CI machine does not have (benchmark images, a GPU): their block carries the
#: opt-out marker of tests/integration/test_doc_examples.py with the reason; every other example runs there.
EXAMPLES_NOT_RUN = {
    "train": ("needs the Stanford Online Products images", [
        "dmlkit train --preset asap-baseline-proxy-anchor-sop --set data.root=/data/Stanford_Online_Products \\",
        "    --set loss.args.matmul_precision=medium      # bf16 proxy products (docs/architecture.md)",
    ]),
    "validate": ("needs the CUB-200-2011 images", [
        "dmlkit validate --preset asap-c2-cub --set data.root=/data/CUB_200_2011 --print   # also checks the data root",
    ]),
    "datasets": ("needs the internet or the benchmark images", [
        "dmlkit datasets info cub200 --root /data/CUB_200_2011",
        "dmlkit datasets download cub200 --root /data/cub --yes   # terms printed, archive fetched, md5 and counts checked",
    ]),
}

#: What the training verbs show, and where the rest goes (Markdown lines).
SHOWN = [
    "## What it shows",
    "",
    "Messages go to stderr through Python's `logging` (the `dmlkit` loggers); the result (the test metrics "
    "table, the run directory) is printed to stdout. By default: the training split and the run in a line each "
    "(model, embedding size, loss, device, precision), the time budget's plan, the progress bar, warnings, "
    "the report's path, then the results. `-v` adds every choice of the recipe with its reason "
    "(`recipe:   sampler.m = 16  (...)`). "
    "`--quiet` shows only the progress bar, warnings and the results; `--no-progress` drops the bar (for "
    "scripts and CI logs; the same as `--set train.progress=false`).",
    "",
    "Whatever the console shows, each run keeps every message, the recipe's reasons included, in "
    "`RUN/train.log` (time-stamped, appended to on `--resume`), and the recipe's choices in `RUN/resolved.json`; "
    "`RUN/log.jsonl` stays the metrics log.",
    "",
]

#: Text after a verb's examples (Markdown lines).
NOTES = {
    "train": SHOWN,
    "crossval": SHOWN[:2] + ["`-v`, `--quiet` and `--no-progress` as for `dmlkit train` ([train.md](train.md)); "
                             "each fold's run keeps its messages in its `train.log`.", ""],
    "sweep": SHOWN[:2] + ["The sweep's progress (a line per trial) is logged to stderr; `--quiet` leaves the final "
                          "result only, `-v` changes nothing more (trials run without messages of their own).", ""],
    "evaluate": [
        "A run whose ensemble members each held out their own fold of the training classes "
        "(`protocol.member_folds`, the glyph recipe's ensemble) has no split held out from every member: "
        "`--split val` is refused there with that reason; the run's own validation (each member scored on its own "
        "fold) is in its `log.jsonl`.",
        "",
        "`--split val` embeds as the run's validations did: over the shifts of `eval.val_shift_average` where the "
        "run set it (the recipe's 1 px where the model averages its embeddings over 2 px), so it reproduces the "
        "run's logged validation metrics; `--set eval.val_shift_average=2` embeds with the test split's shifts. "
        "The test and training splits always take the model's own (`model.shift_average`).",
        "",
    ],
    "report": [
        "## What the page shows",
        "",
        "It opens with the answer in two lines: test MAP@R and P@1 of the kept weights against the untrained "
        "(step 0) embedding where it was evaluated, the split sizes, and what was kept and why. Then: the test "
        "metrics by display name with the counters and split sizes beside them; MAP@R, R@1, training loss and "
        "learning rate on their own axes with the selected step marked, and the validation scores per evaluation; "
        "the embedding map of the test classes by name (training-class proxies in grey); random and worst "
        "queries with similarities, tick/cross marks and the true matches the worst ones missed; the "
        "genuine/impostor similarity histogram and DET curve with the thresholds at FMR 1e-2 and 1e-3, the worst "
        "classes by AP@R and the most-confused class pairs; the configuration (YAML, folded) and the environment "
        "(device, versions, the command). Paths are relative to the run directory.",
        "",
        "The top of the report of a 12-step MNIST run and of a 12-step photo run (10 pet breeds), regenerated by "
        "`scripts/report_screenshots.py`:",
        "",
        "![report of a short MNIST run](../figures/report-mnist.png)",
        "",
        "![report of a short photo run](../figures/report-photos.png)",
        "",
    ],
}

#: The marker (an HTML comment on the line before a fence) that keeps a block out of the examples test.
NOT_RUN_MARKER = "<!-- not run in CI: {reason} -->"


def page(verb: str, help_text: str, actions: dict[str, str] | None = None) -> str:
    lines = [f"# `dmlkit {verb}`", "", "```text", help_text.rstrip(), "```", ""]
    for action, text in (actions or {}).items():  # verbs with sub-commands (`dmlkit index build ...`)
        lines += [f"## `dmlkit {verb} {action}`", "", "```text", text.rstrip(), "```", ""]
    if verb in EXAMPLES:
        intro = [EXAMPLE_INTROS[verb], ""] if verb in EXAMPLE_INTROS else []
        lines += ["## Examples", "", *intro, "```bash", *EXAMPLES[verb], "```", ""]
    if verb in EXAMPLES_NOT_RUN:
        reason, commands = EXAMPLES_NOT_RUN[verb]
        marker = NOT_RUN_MARKER.format(reason=reason)
        lines += [f"Not run by the docs test (it {reason}):", "", marker, "```bash", *commands, "```", ""]
    lines += NOTES.get(verb, [])
    return "\n".join(lines)


def render_all() -> dict[str, str]:
    """``{verb: markdown}`` for every verb the CLI has."""
    import os

    os.environ["COLUMNS"] = "100"
    from dmlkit.cli.main import build_parser

    parser = build_parser()
    sub = parser._subparsers._group_actions[0]
    return {verb: page(verb, p.format_help(), _actions(p)) for verb, p in sub.choices.items()}


def _actions(parser) -> dict[str, str]:
    """``{action: help}`` of a verb's sub-commands (empty for verbs without)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {name: p.format_help() for name, p in action.choices.items()}
    return {}


def main() -> int:
    out = Path(__file__).resolve().parents[1] / "docs" / "cli"
    out.mkdir(parents=True, exist_ok=True)
    for verb, text in render_all().items():
        (out / f"{verb}.md").write_text(text)
        print(out / f"{verb}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
