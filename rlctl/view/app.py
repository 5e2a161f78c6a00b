"""`rlctl view`: the terminal UI over run folders (Textual). What it reads is rlctl.view.data's.

Two tabs: Curves (any metric, several runs overlaid, re-read while a run trains) and Samples (a
table of every sample, filtered by the words of rlctl.view.samples.parse_filter and sorted by a
column). Enter opens a sample (rlctl.view.screens); keys are in the footer; `?` explains them.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Input, SelectionList, Static, TabbedContent, TabPane

from rlctl.view.chart import braille_chart
from rlctl.view.data import RunView, load_samples, read_rollout_file, rollout_files
from rlctl.view.samples import SORT_KEYS, parse_filter, sort_samples
from rlctl.view.screens import HelpScreen, PromptScreen, SampleScreen

DEFAULT_METRICS = ("reward/mean", "train/loss", "val/reward/mean", "val/loss")
COLUMNS = ("run", "step", "#", "source", "score", "acc", "len", "turns", "calls", "err", "response")
MAX_ROWS = 500    # rows put in the table at once (a 64k-row table is slow to fill); the filter narrows the rest
FILTER_DELAY_S = 0.25   # the filter runs once typing pauses, not on every key


class ViewApp(App):
    """Curves and samples of `runs` (RunViews); `follow_s`: how often metrics.jsonl is re-read (0: never)."""

    TITLE = "rlctl view"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #curves-row { height: 1fr; }
    #metrics { width: 26; height: 1fr; border: round $primary; }
    #chart { width: 1fr; height: 1fr; padding: 0 1; }
    #filter { height: 3; }
    #status { height: 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("c", "show_tab('curves')", "curves"),
        Binding("v", "show_tab('samples')", "samples"),
        Binding("slash", "focus_filter", "filter", key_display="/"),
        Binding("s", "cycle_sort", "sort"),
        Binding("r", "reverse_sort", "reverse"),
        Binding("p", "same_prompt", "same prompt"),
        Binding("escape", "leave_filter", "leave the filter", show=False),
    ]

    def __init__(self, runs: list[RunView], *, follow_s: float = 1.0):
        super().__init__()
        self.runs = runs
        self.follow_s = follow_s
        self.sort_key, self.reverse = "step", False
        self.shown: list[tuple[RunView, dict]] = []
        self._filter = parse_filter("")
        self._filter_timer = None
        self._reading = "reading the samples..." if not all(run.samples_loaded for run in runs) else ""
        self._seen_files: dict[int, set[str]] = {id(run): set() for run in runs}

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with TabbedContent(initial="curves"):
            with TabPane("Curves", id="curves"):
                with Horizontal(id="curves-row"):
                    yield SelectionList[str](id="metrics")
                    yield Static(id="chart")
            with TabPane("Samples", id="samples"):
                with Vertical():
                    yield Input(placeholder="filter: reward>0.5 acc=0 source:gsm8k len<100 turns>1 errors>0 words",
                                id="filter")
                    yield Static(id="status")
                    yield DataTable(id="table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = " + ".join(f"{run.name} ({run.kind})" for run in self.runs)
        table = self.query_one("#table", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self.refresh_metric_list(initial=True)
        self.call_after_refresh(self.draw_chart)   # once the layout has given the chart its size
        for run in self.runs:
            if run.samples_loaded:
                self._seen_files[id(run)] = {str(f) for f in rollout_files(run.path)} if run.kind != "eval" else set()
            for note in run.notes:
                self.notify(f"{run.name}: {note}", severity="warning", timeout=8)
        self.refresh_samples()
        if not all(run.samples_loaded for run in self.runs):   # a large run: curves now, samples when read
            self.run_worker(self._read_samples, thread=True, exclusive=True, group="samples")
        if self.follow_s > 0:
            self.set_interval(self.follow_s, self.follow)

    def _read_samples(self) -> None:
        """In a worker thread: each run's samples, handed to the app as the step files are read (after 0.5 s,
        then at doubling intervals up to 8 s: each hand-over re-sorts the table), so a large run's table
        fills up while the rest is read."""
        for run in self.runs:
            if run.samples_loaded:
                continue
            files = rollout_files(run.path)
            if not files:   # samples.jsonl (few lines) or nothing
                notes: list[str] = []
                self.call_from_thread(self._samples_read, run, load_samples(run.path, notes), notes, [], "")
                continue
            batch, notes, last, wait = [], [], time.monotonic(), 0.5
            for k, file in enumerate(files, 1):
                batch += read_rollout_file(file, notes)
                if k == len(files) or time.monotonic() - last > wait:
                    done = "" if k == len(files) else f"{k}/{len(files)} steps"
                    self.call_from_thread(self._samples_read, run, batch, notes, files[:k], done)
                    batch, notes, last, wait = [], [], time.monotonic(), min(2 * wait, 8.0)

    def _samples_read(self, run: RunView, samples: list[dict], notes: list[str], files: list, reading: str) -> None:
        """`samples` more of `run`'s (read from `files`); `reading`: how far the reading is, "" when done."""
        run.samples += samples
        run.samples_loaded = not reading
        self._reading = f"reading {run.name}'s samples: {reading}" if reading else ""
        self._seen_files[id(run)].update(str(f) for f in files)
        for note in notes:
            self.notify(f"{run.name}: {note}", severity="warning", timeout=8)
        self.refresh_samples()

    # -- curves ---------------------------------------------------------------------------------------

    def refresh_metric_list(self, initial: bool = False) -> None:
        widget = self.query_one("#metrics", SelectionList)
        keys = sorted({key for run in self.runs for key in run.metric_keys})
        have = {widget.get_option_at_index(i).value for i in range(widget.option_count)}
        chosen = set(widget.selected)
        if initial:
            chosen = {k for k in DEFAULT_METRICS if k in keys} or set(keys[:1])
        for key in keys:
            if key not in have:
                widget.add_option((key, key, key in chosen))
        self.draw_chart()

    def draw_chart(self) -> None:
        chart = self.query_one("#chart", Static)
        chosen = self.query_one("#metrics", SelectionList).selected
        series = []
        for run in self.runs:
            for key in chosen:
                xs, ys = run.series(key)
                label = f"{run.name}: {key}" if len(self.runs) > 1 else key
                series.append((label, xs, ys))
        if not any(run.metrics for run in self.runs):
            chart.update("no metrics yet (the run has not finished a step); this view follows metrics.jsonl")
            return
        size = chart.content_size
        chart.update(braille_chart(series, max(size.width, 20), max(size.height, 6)))

    def on_selection_list_selected_changed(self, _event) -> None:
        self.draw_chart()

    def on_resize(self, _event) -> None:
        self.call_after_refresh(self.draw_chart)

    def follow(self) -> None:
        """Re-read what a training run appended: metrics rows and new rollouts/step_<N>.jsonl files."""
        grew = sum(run.follow() for run in self.runs)
        if grew:
            self.refresh_metric_list()
        added = False
        for run in self.runs:
            if run.kind == "eval" or not run.samples_loaded:
                continue
            for file in rollout_files(run.path):
                if str(file) not in self._seen_files[id(run)]:   # a step finished since: only its file is read
                    self._seen_files[id(run)].add(str(file))
                    run.samples += read_rollout_file(file, [])
                    added = True
        if added:
            self.refresh_samples()

    # -- samples --------------------------------------------------------------------------------------

    def refresh_samples(self) -> None:
        table = self.query_one("#table", DataTable)
        table.clear()
        rows = [(run, s) for run in self.runs for s in run.samples if self._filter(s)]
        total = sum(len(run.samples) for run in self.runs)
        order = sort_samples([s for _, s in rows], self.sort_key, self.reverse)
        owner = {id(s): run for run, s in rows}
        self.shown = [(owner[id(s)], s) for s in order]
        for k, (run, s) in enumerate(self.shown[:MAX_ROWS]):
            table.add_row(*self._cells(run, s), key=str(k))
        more = f" (first {MAX_ROWS} in the table: filter to narrow)" if len(self.shown) > MAX_ROWS else ""
        arrow = "desc" if self.reverse else "asc"
        reading = f"  ({self._reading})" if self._reading else ""
        self.query_one("#status", Static).update(
            f"{len(self.shown)} of {total} samples  sorted by {self.sort_key} {arrow}{more}{reading}"
            if total or self._reading else "an SFT run logs no samples: its curves are in the Curves tab"
            if all(run.kind == "sft" for run in self.runs)
            else "no samples logged (set run.log_rollouts = true, or run.log_samples > 0)")

    def _cells(self, run: RunView, s: dict) -> tuple:
        last = next((m["content"] for m in reversed(s["messages"]) if m["gen"]), "")
        return (run.name[:12], s["step"], s["i"], s["source"][:14], _num(s["score"]), _num(s["acc"]),
                "" if s["length"] is None else s["length"], s["turns"], s["calls"], s["errors"],
                " ".join(last.split())[:60])

    def on_input_changed(self, event: Input.Changed) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(FILTER_DELAY_S, lambda: self.apply_filter(event.value))

    def apply_filter(self, text: str) -> None:
        self._filter_timer = None
        try:
            self._filter = parse_filter(text)
        except ValueError as e:
            self.query_one("#status", Static).update(Text(str(e), style="red"))
            return
        self.refresh_samples()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self._filter_timer is not None:   # enter applies the filter at once
            self._filter_timer.stop()
            self.apply_filter(event.value)
        self.query_one("#table", DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        run, sample = self.shown[int(event.row_key.value)]
        self.push_screen(SampleScreen(run, sample))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = {"score": "score", "acc": "acc", "len": "length", "turns": "turns", "err": "errors",
               "source": "source", "step": "step"}.get(str(event.column_key.value))
        if key:
            self.reverse = not self.reverse if key == self.sort_key else key != "step"
            self.sort_key = key
            self.refresh_samples()

    def current(self) -> tuple[RunView, dict] | None:
        table = self.query_one("#table", DataTable)
        if not self.shown or table.cursor_row is None or table.cursor_row >= min(len(self.shown), MAX_ROWS):
            return None
        return self.shown[table.cursor_row]

    # -- actions --------------------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        # Focus moves first: a focused widget in the pane being hidden hands the focus on to the next
        # one, the filter box in the samples pane, and TabbedContent follows the focus back there.
        self.query_one("#table" if tab == "samples" else "#metrics").focus()
        self.query_one(TabbedContent).active = tab

    def action_focus_filter(self) -> None:
        self.action_show_tab("samples")
        self.query_one("#filter", Input).focus()

    def action_leave_filter(self) -> None:
        """Escape in the filter box: back to the table, where the letter keys are keys again."""
        if isinstance(self.focused, Input):
            self.query_one("#table", DataTable).focus()

    def action_cycle_sort(self) -> None:
        self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
        self.reverse = self.sort_key != "step"   # best first, except for steps
        self.refresh_samples()

    def action_reverse_sort(self) -> None:
        self.reverse = not self.reverse
        self.refresh_samples()

    def action_same_prompt(self) -> None:
        picked = self.current()
        if picked is not None:
            self.push_screen(PromptScreen(picked[0], picked[1]["prompt"]))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """Letter keys go to the filter box while it has the focus (q, s, r... are words too), and the
        tabs' keys rest while a sample or the help is open over them."""
        if action in ("quit", "help", "cycle_sort", "reverse_sort", "same_prompt", "show_tab", "focus_filter") \
                and isinstance(self.focused, Input):
            return False
        if action in ("cycle_sort", "reverse_sort", "same_prompt", "show_tab", "focus_filter") \
                and len(self.screen_stack) > 1:
            return False
        return True


def _num(value) -> str:
    return "" if value is None else f"{value:.3g}"
