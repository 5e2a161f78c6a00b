"""Convert every launch script of a verl checkout with `rlctl config from-verl` and validate the result.

    python scripts/verl_report.py --verl ~/src/verl                      # a clone (its work tree)
    python scripts/verl_report.py --verl /work/.mirror/volcengine+verl/repo   # a bare git dir: read at HEAD

Prints one line per script of verl's examples/ (leaving out the folders of --skip, as docs/verl.md
counts them): `validates`, `converted, does not validate: <first error>`, `not converted: <why>`
or `not a trainer: <the rlctl command that does its job>`, then the totals. A bare git dir (what
the `fetch` tool gives) is read with `git ls-tree` / `git show` at --rev, no work tree needed.

A script that stops without arguments (`if [ "$#" -lt 2 ]; then echo "Usage: ..."; exit 1; fi`) is
given the ones its usage line names (`8` for a GPU count, `checkpoints/<name>` for the rest). The
scripts read the environment as verl's would (`${MODEL_PATH:-...}`): run it with a clean one
(`env -i HOME=$HOME PATH=$PATH ...`) for figures others can repeat.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

SKIP = ("ascend", "profile", "generation", "tuning")


def scripts_of(verl: Path, rev: str, skip: tuple, into: Path) -> tuple[list[Path], str]:
    """The examples/ launch scripts (copied under `into` when read from a bare git dir) and the commit."""
    bare = (verl / "HEAD").is_file() and (verl / "objects").is_dir()
    git = ["git", "--git-dir", str(verl if bare else verl / ".git")]
    commit = ""
    if bare or (verl / ".git").exists():
        commit = subprocess.run([*git, "rev-parse", "--short", rev], capture_output=True, text=True).stdout.strip()
    if bare:
        names = subprocess.run([*git, "ls-tree", "-r", "--name-only", rev, "examples"], capture_output=True,
                               text=True, check=True).stdout.split()
    else:
        names = [str(p.relative_to(verl)) for p in (verl / "examples").rglob("*.sh")]
    names = sorted(n for n in names if n.endswith(".sh") and not set(Path(n).parts[1:-1]) & set(skip))
    if not bare:
        return [verl / n for n in names], commit or "(not a git checkout)"
    paths = []
    for name in names:
        path = into / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(subprocess.run([*git, "show", f"{rev}:{name}"], capture_output=True, check=True).stdout)
        paths.append(path)
    return paths, commit


def usage_args(script: Path) -> list[str]:
    """The arguments a script's own `Usage: NAME <nproc_per_node> <save_path>` line asks for, as a verl
    user types them (8 GPUs, a folder); none when it prints no usage line."""
    m = re.search(r"Usage: \S+((?:\s+<[^>]+>)+)", script.read_text(errors="replace"))
    names = re.findall(r"<([^>]+)>", m.group(1)) if m else []
    return ["8" if re.search(r"nproc|gpus|num", n) else f"checkpoints/{n}" for n in names]


def check(script: Path, out: Path) -> tuple[str, str]:
    """(status, why) for one script: converted and validated in this process, as the CLI does."""
    from rlctl.cli.config_cmd import known_algorithms
    from rlctl.config.from_verl import convert_launch
    from rlctl.config.loader import load_config
    from rlctl.config.verl_script import NotATrainer
    from rlctl.errors import RlctlError
    from rlctl.validate import validate

    try:
        text, _, _ = convert_launch([str(script), *usage_args(script)], known_algorithms())
    except NotATrainer as e:
        return "not a trainer", e.message
    except RlctlError as e:
        return "not converted", e.message
    except Exception as e:   # a bug in the converter: counted, named, and the report goes on
        return "not converted", f"crashed: {type(e).__name__}: {e}"
    out.write_text(text)
    try:
        loaded = load_config(out, [], strict=False)
        problems, _ = validate(loaded, machine=False)
    except RlctlError as e:
        problems = getattr(e, "problems", None) or [e.message]
    errors = [p for p in problems if getattr(p, "severity", "error") == "error"]
    return ("validates", "") if not errors else ("does not validate", str(errors[0]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl", type=Path, required=True, help="a verl clone or bare git dir")
    parser.add_argument("--rev", default="HEAD", help="the commit to read from a bare git dir")
    parser.add_argument("--skip", nargs="*", default=list(SKIP), help="examples/ folders left out")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scripts, commit = scripts_of(args.verl.expanduser(), args.rev, tuple(args.skip), Path(tmp) / "verl")
        rows = []
        for i, script in enumerate(scripts):
            status, why = check(script, Path(tmp) / f"{i}.toml")
            name = str(script.relative_to(Path(tmp) / "verl" if str(script).startswith(tmp) else args.verl))
            rows.append({"script": name, "status": status, "why": why})
    counts = Counter(r["status"] for r in rows)
    trainers = len(rows) - counts["not a trainer"]
    converted = counts["validates"] + counts["does not validate"]
    totals = {"verl_commit": commit, "scripts": len(rows), "not_a_trainer": counts["not a trainer"],
              "training_scripts": trainers, "converted": converted, "validates": counts["validates"]}
    if args.format == "json":
        print(json.dumps({"totals": totals, "scripts": rows}, indent=2))
        return 0
    for r in rows:
        print(f"{r['script']}: {r['status']}" + (f": {r['why']}" if r["why"] else ""))
    print(f"\nverl {commit}: {len(rows)} launch scripts ({', '.join(args.skip)} left out); "
          f"{counts['not a trainer']} run no trainer (answered with the rlctl command)")
    print(f"training scripts: {trainers}; converted {converted}/{trainers}; "
          f"validate {counts['validates']}/{trainers} ({100 * counts['validates'] / max(converted, 1):.0f}% "
          f"of the converted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
