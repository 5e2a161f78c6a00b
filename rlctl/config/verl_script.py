"""A verl launch script (or its overrides) -> the `key=value` overrides it passes to verl's trainer.

verl's examples/ and recipe/ scripts set shell variables (`n=16`, `export LR=${LR:-1e-6}`,
`max_len=$((1024 * 2))`) and arrays of overrides (`DATA=( data.train_batch_size=8 ... )`), then run
`python3 -m verl.trainer.main_ppo "${DATA[@]}" key=value ... "$@"` over backslash-continued lines.
`read_launch` follows that much bash: comments, continuations, quoted values over several lines,
assignments, arrays (`=( )`, `+=( )`, `"${NAME[@]}"`), `$VAR` / `${VAR}` / `${VAR:-default}` /
`${VAR:=default}`, `$1`, integer `$((...))`, the environment for variables the script does not set,
and the script's own arguments for `$@` / `${@:2}` (the words given after the script), and
`${VAR//from/to}`. `if` and `case` blocks are followed where their condition can be read
(rlctl.config.verl_flow), here-documents are skipped, and the command ends at a pipe, `;`, `&&` or
a redirection. A `$(command)` is not run: a value that needs one is reported, not guessed.

The command found is a trainer (verl's PPO-family mains, `recipe.<name>.main_*`, or its SFT
trainers under torchrun); a script that runs only another verl tool (the model merger, generation,
eval) is answered with NotATrainer, naming the rlctl command that does that job.
"""

from __future__ import annotations

import ast
import operator
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.config.verl_flow import Flow, split_words
from rlctl.errors import UsageError

# the entry points of verl's trainers; the words after one are its overrides
ENTRY_POINTS = re.compile(r"(^|[\s/.])(main_ppo|main_ppo_split|main_dapo|main_grpo|main_prime|main_spin|main_sppo|"
                          r"main_gspo|fsdp_sft_trainer|sft_trainer|recipe\.\w+\.main_\w+)(\.py)?$")
SFT_ENTRY = re.compile(r"(^|[\s/.])(fsdp_sft_trainer|sft_trainer)(\.py)?$")
# verl's other tools -> the rlctl command that does the same job
OTHER_TOOLS = (
    (re.compile(r"(^|[\s/.])(model_merger|legacy_model_merger)(\.py)?$"),
     "verl's model merger: `rlctl merge RUN_DIR --to-hf OUT` writes a Hugging Face folder from an rlctl run"),
    (re.compile(r"(^|[\s/.])main_generation(_server)?(\.py)?$"),
     "verl's generation main: `rlctl eval MODEL --data FILE --out OUT.jsonl` generates (and scores) responses"),
    (re.compile(r"(^|[\s/.])main_eval(\.py)?$"), "verl's eval main: `rlctl eval MODEL --data FILE` scores a model"),
    (re.compile(r"(^|[\s/.])converter_hf_to_mcore(\.py)?$"),
     "verl's Hugging Face -> Megatron converter: rlctl trains from the Hugging Face folder as it is"),
)


class NotATrainer(UsageError):
    """The script runs a verl tool that is not a trainer: the message names rlctl's command for its job."""
_ASSIGN = re.compile(r"^(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$",
                     re.DOTALL)   # a quoted value may run over lines
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|\d+)(?:(:?[-=])((?:[^{}]|\{[^{}]*\})*))?\}|\$([A-Za-z_][A-Za-z0-9_]*|\d)")
_ARRAY_REF = re.compile(r'"?\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}"?')
_ARRAY_ASSIGN = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)\)\s*$",
                           re.DOTALL)
_KEYWORDS = re.compile(r"^(if|elif|else|fi|then|for|while|until|do|done|case|esac|function|\{|\})(\s|;|$)")
_STOP = re.compile(r"^(\||\|\||&&|;|&|\d?>.*|>.*|<.*|2>&1)$")   # the command ends here
UNRESOLVED = "\x00cmd\x00"   # stands for a `$(command)` in a value
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.Pow: operator.pow}


@dataclass
class Launch:
    """What a launch passes verl: its overrides in order, and what could not be read."""
    overrides: list[tuple[str, str]] = field(default_factory=list)   # (key, value as written after expansion)
    unresolved: list[str] = field(default_factory=list)              # keys whose value needs a shell command
    options: list[str] = field(default_factory=list)                 # hydra's own flags (--config-name ...)
    entry: str = ""
    added: set[str] = field(default_factory=set)                      # keys written `+key=value` (hydra's append)
    launcher: list[str] = field(default_factory=list)                 # the words before the entry (torchrun ...)

    @property
    def sft(self) -> bool:
        return bool(SFT_ENTRY.search(self.entry))


def _arith(expr: str, variables: dict) -> str:
    """bash's integer `$((...))`, variables named bare or with `$`."""
    text = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: str(variables.get(m.group(1), os.environ.get(
        m.group(1), "0"))), expr)
    if UNRESOLVED in text or "$(" in text:   # a variable set by a shell command: the value is unknown
        return UNRESOLVED

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:   # 2**10**10 would never finish
                raise ValueError(expr)
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(expr)

    try:
        return str(value(ast.parse(text.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError):
        raise UsageError(f"$(({expr})) is not integer arithmetic rlctl can evaluate",
                         hint="replace it with its value in the script, or pass the key as an override.") from None


def _arith_all(text: str, variables: dict) -> str:
    """Every `$((...))`, inner parentheses balanced, replaced by its value."""
    while True:
        start = text.find("$((")
        if start < 0:
            return text
        depth, i = 0, start + 1
        for i in range(start + 1, len(text)):
            depth += (text[i] == "(") - (text[i] == ")")
            if depth == 0:
                break
        if depth != 0 or text[i - 1] != ")":
            raise UsageError(f"{text[start:start + 60]!r}: an unclosed $((...))", hint="check the script's parentheses.")
        text = text[:start] + _arith(text[start + 3:i - 1], variables) + text[i + 1:]


def _array_words(m, variables: dict) -> str:
    """`${NAME[@]}` -> the array's words, each quoted so it stays one word."""
    value = variables.get(m.group(1), [])
    items = value if isinstance(value, list) else ([value] if value else [])
    return " ".join(shlex.quote(w) for w in items)


def expand(text: str, variables: dict, args: list[str]) -> str:
    """The text with shell variables replaced (not inside single quotes)."""
    parts = re.split(r"('[^']*')", text)
    return "".join(part if part.startswith("'") else _expand_part(part, variables, args) for part in parts)


_ARGS_FROM = re.compile(r'"?\$\{[@*]:(\d+)(?::(\d+))?\}"?')
_REPLACE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(//?)([^/{}]*)/([^{}]*)\}")


def _replaced(m, variables: dict) -> str:
    """`${VAR//from/to}` (every match) or `${VAR/from/to}` (the first), `from` taken literally."""
    value = variables.get(m.group(1), os.environ.get(m.group(1), ""))
    value = " ".join(value) if isinstance(value, list) else value
    return value.replace(m.group(3), m.group(4), -1 if m.group(2) == "//" else 1) if m.group(3) else value


def _args_from(m, args: list[str]) -> str:
    """`${@:N}` / `${@:N:LEN}`: the script's arguments from $N on."""
    start = max(int(m.group(1)) - 1, 0)
    chosen = args[start:start + int(m.group(2))] if m.group(2) else args[start:]
    return " ".join(shlex.quote(a) for a in chosen)


def _expand_part(text: str, variables: dict, args: list[str]) -> str:
    text = _ARGS_FROM.sub(lambda m: _args_from(m, args), text)
    text = _REPLACE.sub(lambda m: _replaced(m, variables), text)
    text = text.replace('"$@"', " ".join(shlex.quote(a) for a in args)).replace("$@", " ".join(args))
    text = re.sub(r"\$#(?![A-Za-z_{])", str(len(args)), text)   # the number of arguments
    text = text.replace("$*", " ".join(args))
    text = _arith_all(text, variables)
    text = _ARRAY_REF.sub(lambda m: _array_words(m, variables), text)
    text = re.sub(r"\$\([^()]*\)|`[^`]*`", UNRESOLVED, text)

    def var(m):
        name = m.group(1) or m.group(4)
        if name.isdigit():   # $1, ${2:-default}: the script's own arguments
            current = args[int(name) - 1] if 0 < int(name) <= len(args) else None
        else:
            current = variables.get(name, os.environ.get(name))
            current = (current[0] if current else None) if isinstance(current, list) else current
        if m.group(2) is not None and (current is None or (m.group(2).startswith(":") and current == "")):
            default = _expand_part(m.group(3) or "", variables, args)
            if m.group(2).endswith("="):
                variables[name] = default
            return default
        return current or ""

    for _ in range(5):   # a default may name another variable
        expanded = _VAR.sub(var, text)
        if expanded == text:
            break
        text = expanded
    return text


def logical_lines(script: str) -> list[str]:
    """Commands one per line: backslash continuations joined, a quote or an array `( ... )` left open
    runs on over the next lines, comments dropped."""
    joined = re.sub(r"\\\s*$", "", re.sub(r"\\\r?\n", " ", script))   # also a last line's dangling backslash
    out, buffer, heredoc = [], "", None
    for line in joined.splitlines():
        stripped = line.strip()
        if heredoc is not None:   # a here-document's body is text, not commands
            heredoc = None if stripped == heredoc else heredoc
            continue
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        opened = _HEREDOC.search(line)
        if opened:
            heredoc = opened.group(1)
        buffer = f"{buffer}\n{line}" if buffer else stripped
        if _complete(buffer):
            out.append(buffer)
            buffer = ""
    if buffer:
        out.append(buffer)
    return out


def _complete(text: str) -> bool:
    """Whether `text` closes its quotes and (for an array assignment) its parentheses."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return False
    if not _ARRAY_OPEN.match(text):
        return True
    return "".join(words).count("(") <= "".join(words).count(")")


_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_ARRAY_OPEN = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?[A-Za-z_][A-Za-z0-9_]*\+?=\(")


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError as e:
        raise UsageError(f"cannot read the shell line {line[:80]!r}: {e}",
                         hint="check its quotes, or pass the overrides themselves.") from None


def read_script(text: str, args: list[str], where: str) -> Launch:
    """The overrides of the first verl trainer command in a shell script (NotATrainer when it runs
    only another verl tool)."""
    variables: dict[str, str | list[str]] = {}
    flow, other, said = Flow(lambda cond: split_words(expand(cond, variables, args))), None, ""
    for logical in logical_lines(text):
        line = flow.line(logical)
        if not line:
            continue
        line = _KEYWORDS.sub("", line).strip() if _KEYWORDS.match(line) else line
        array = _ARRAY_ASSIGN.match(line)
        if array:   # NAME=( words ) or NAME+=( words )
            words = _words(expand(array.group(3), variables, args))
            old = variables.get(array.group(1), []) if array.group(2) else []
            variables[array.group(1)] = (old if isinstance(old, list) else [old]) + words
            continue
        try:
            words = _words(expand(line, variables, args))
        except UsageError:
            if ENTRY_POINTS.search(line.split("#")[0]):
                raise
            continue   # a line bash reads that shlex cannot (it sets nothing verl reads)
        if words and words[0] == "shift":   # `shift 2`: $@ and $1 move on
            args = args[int(words[1]) if len(words) > 1 and words[1].isdigit() else 1:]
            continue
        if words and words[0] == "echo":
            said = " ".join(words[1:])
        if words and words[0] == "exit" and words[1:2] not in ([], ["0"]) and flow.certain():
            raise UsageError(f"{Path(where).name} stops before its trainer (`{' '.join(words)}`"
                             + (f" after printing {said!r}" if said else "") + ")",
                             hint="pass the arguments the script asks for after its path, as you would to bash.")
        at = next((i for i, w in enumerate(words) if " " not in w and ENTRY_POINTS.search(w)), None)
        if at is not None:
            rest = words[at + 1:]
            end = next((i for i, w in enumerate(rest) if _STOP.match(w)), len(rest))
            launch = _launch(rest[:end], entry=words[at])
            launch.launcher = words[:at]
            return launch
        other = other or next((job for w in words for pattern, job in OTHER_TOOLS if pattern.search(w)), None)
        _assign(line, variables, args)
    if other:
        raise NotATrainer(f"{Path(where).name} runs no trainer: it runs {other}",
                          hint="rlctl config from-verl converts verl's training launches (main_ppo, the SFT trainer).")
    raise UsageError(f"{where} runs no verl trainer (no `python3 -m verl.trainer.main_ppo ...` line)",
                     hint="pass the script that launches verl, or the key=value overrides themselves.")


def _assign(line: str, variables: dict, args: list[str]) -> None:
    """`VAR=value` (or `export A=1 B=2`): each value as bash would store it (words joined by a space)."""
    assign = _ASSIGN.match(line)
    if not assign:
        return
    words = _words(expand(line.split(None, 1)[1] if line.split(None, 1)[0] in ("export", "local", "readonly")
                          else line, variables, args))
    if len(words) > 1 and all("=" in w and re.match(r"[A-Za-z_]\w*=", w) for w in words):
        for word in words:   # export A=1 B=2
            name, _, value = word.partition("=")
            variables[name] = value
        return
    variables[assign.group(1)] = " ".join(_words(expand(assign.group(2), variables, args)))


_VALUE_OPTIONS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")   # hydra's, value apart


def _launch(words: list[str], entry: str = "") -> Launch:
    launch = Launch(entry=entry)
    for i, word in enumerate(words):
        if i and words[i - 1] in _VALUE_OPTIONS:
            launch.options[-1] += f" {word}"
            continue
        if word.startswith("-"):
            launch.options.append(word.replace(UNRESOLVED, "$(...)"))
            continue
        if not word.strip():
            raise UsageError("the command has a word that is only whitespace (a backslash before a space, as in "
                             "`\\  # comment`): bash passes it to verl, whose hydra refuses it too",
                             hint="end the line with the backslash, and put the comment on a line of its own.")
        if "=" not in word:
            raise UsageError(f"{word!r} is not a verl override (key=value)",
                             hint="verl's trainer takes key=value words, e.g. data.train_batch_size=256.")
        key, value = word.split("=", 1)
        if key.startswith("+"):   # +key adds, ++key adds or overrides: either may be a key verl's YAML lacks
            launch.added.add(key.lstrip("+"))
        key = key.lstrip("+~")   # hydra's append (+key) / force (++key) / delete (~key) marks
        if UNRESOLVED in value:
            launch.unresolved.append(key)
            continue
        launch.overrides.append((key, value))
    return launch


def read_launch(words: list[str]) -> Launch:
    """A script path (then its arguments, which `$@` passes on) or the overrides themselves."""
    if not words:
        raise UsageError("nothing to convert", hint="rlctl config from-verl run_grpo.sh (or key=value ...)")
    first = Path(words[0])
    if "=" not in words[0] and first.is_file():
        try:
            text = first.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read {first}: {e}") from None
        return read_script(text, words[1:], str(first))
    if "=" not in words[0]:
        raise UsageError(f"{words[0]}: no such script, and not a key=value override",
                         hint="pass a verl launch script or its overrides (data.train_batch_size=256 ...).")
    return read_script("python3 -m verl.trainer.main_ppo " + " ".join(shlex.quote(w) for w in words), [],
                       "the overrides")
