"""``dmlkit push RUN_DIR REPO_ID``: share a run as a Hugging Face model repository."""

from __future__ import annotations

import argparse


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Upload a run's selected weights (model.safetensors), config.yaml, its evaluation preprocessing,\n"
        "metrics and a model card (README.md, written from the run) to the Hugging Face model repository\n"
        "REPO_ID, created when missing. Log in first (`hf auth login`, or set HF_TOKEN).\n"
        'Load it anywhere with dmlkit.load("hf://REPO_ID"). Needs: pip install "dmlkit[hub]".'
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")
    p.add_argument("repo_id", metavar="REPO_ID", help="the model repository, user/name (or org/name)")
    p.add_argument("--checkpoint", choices=["best", "last"], default="best", help="which weights (default: best)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--message", metavar="TEXT", help="commit message (default: names the run and checkpoint)")
    p.add_argument("--local", metavar="DIR",
                   help="write the repository's files to the new folder DIR instead of uploading them "
                   "(to read the model card first; dmlkit.load(DIR) loads it)")


def run(args: argparse.Namespace) -> int:
    from dmlkit.sharing import _check_repo_id, push_run, write_shared_folder

    if args.local:
        folder = write_shared_folder(args.run_dir, args.local, checkpoint=args.checkpoint,
                                     repo_id=_check_repo_id(args.repo_id))
        print(f"wrote the files of {args.repo_id} to {folder} (model card: {folder / 'README.md'})")
        return 0
    url = push_run(args.run_dir, args.repo_id, checkpoint=args.checkpoint, private=args.private,
                   commit_message=args.message)
    print(f"pushed {args.run_dir} to {url}")
    print(f'load it with dmlkit.load("hf://{args.repo_id.removeprefix("hf://")}")')
    return 0
