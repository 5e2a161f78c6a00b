"""Regenerate docs/verl.md's key table from rlctl.config.from_verl (tests/config/test_from_verl.py checks it)."""

from pathlib import Path

from rlctl.config.from_verl import key_table

START, END = "<!-- from-verl table: start -->\n", "<!-- from-verl table: end -->"
page = Path(__file__).parents[1] / "docs" / "verl.md"
text = page.read_text()
head, rest = text.split(START, 1)
page.write_text(head + START + key_table() + END + rest.split(END, 1)[1])
print(f"wrote {page}")
