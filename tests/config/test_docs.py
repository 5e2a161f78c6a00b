"""docs/config.md is what scripts/gen_config_docs.py renders from the schema (run in this process:
the script is a function of the schema, not of a fresh interpreter)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (ROOT / "docs" / "config.md").read_text() == gen.render(), \
        "docs/config.md is stale; run python scripts/gen_config_docs.py"
