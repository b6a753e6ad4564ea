"""docs/cli/<verb>.md exist for every verb and match the current --help (regenerate with scripts/gen_cli_docs.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_verb_has_a_current_page():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pages = module.render_all()
    assert {"train", "evaluate", "crossval", "presets"} <= pages.keys()
    stale = [v for v, text in pages.items() if not (ROOT / "docs" / "cli" / f"{v}.md").is_file()
             or (ROOT / "docs" / "cli" / f"{v}.md").read_text() != text]
    assert not stale, f"docs/cli pages out of date for {stale}: run .venv/bin/python scripts/gen_cli_docs.py"
