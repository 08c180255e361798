"""The framework matrix: every framework fixture of fixtures/scripts/ (the Hugging Face
Trainer, accelerate, Lightning Fabric, Lightning's Trainer, TRL's SFTTrainer, plain DDP),
correct and with the mistakes users make in it, run by ``ddp-verify parity`` at layouts 1x4,
2x2 and 4x1 against 1x1, and scored against each configuration's own truth (known by how it
was written, never from the tool's word): equivalent where it is right, the named finding
where it is not.

    python benchmarks/framework_matrix.py [--configs GLOB ...] [--label current]
        [--write docs/frameworks.md] [--findings findings/frameworks/current] [--json out.json]

Prints one line per configuration as it goes, then the table (configuration x layout ->
equivalent, or the finding's code). ``--write`` puts the table, the releases it ran on and
the time each took in a Markdown page, as the section ``--label`` names; ``--findings``
writes, for each configuration the tool finds wrong, a reproducer: the ``ddp-verify parity``
command that shows it, with the finding it gives. Exits 1 where any answer is wrong.
``tox -e frameworks-current`` and ``tox -e frameworks-older`` run it on two release sets.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddp_verify.parity.layouts import Layout  # noqa: E402
from ddp_verify.parity.run import run_parity  # noqa: E402

SCRIPTS = ROOT / "fixtures" / "scripts"
LAYOUTS = (Layout(1, 4), Layout(2, 2), Layout(4, 1))
PLACEHOLDERS = ("--grad-accum", "{grad_accum}", "--batch-size", "{micro_batch}")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _older(package: str, release: tuple[int, ...]) -> bool:
    found = _version(package)
    if found is None:
        return False
    parts = tuple(int(p) for p in found.split(".")[:3] if p.isdigit())
    return parts < release


# What a configuration's truth is at a layout: None where it trains what one process on the
# whole batch trains, the finding's code where it does not.
Truth = Callable[[Layout], str | None]


def everywhere(code: str) -> Truth:
    return lambda layout: code


def where_ranks(code: str, otherwise: str | None = None) -> Truth:
    return lambda layout: code if layout.world_size > 1 else otherwise


def where_accumulating(code: str) -> Truth:
    return lambda layout: code if layout.grad_accum > 1 else None


def right(layout: Layout) -> str | None:
    return None


def own_mean(layout: Layout) -> str:
    # Each micro-batch its own token mean: across micro-batches the weights go as their
    # tokens; with one micro-batch per rank, it is each rank's own mean.
    return "micro:own-mean" if layout.grad_accum > 1 else "ranks:world"


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    script: str
    flags: tuple[str, ...]
    truth: Truth
    needs: tuple[str, ...]
    global_batch: int = 8
    why: str = ""
    # How each layout starts (ddp-verify parity --launcher).
    launcher: str = "torchrun"

    def command(self) -> list[str]:
        return ["python", str(SCRIPTS / self.script), *PLACEHOLDERS, *self.flags]


def _trainer_truth() -> Truth:
    # Before transformers 4.46 the Trainer averaged each micro-batch over its own tokens
    # (the accumulation bug it fixed with num_items_in_batch).
    return own_mean if _older("transformers", (4, 46)) else right


def configs() -> list[Config]:
    hf, acc, light, trl = ("transformers",), ("accelerate",), ("lightning",), ("trl",)
    accelerate_loops = [
        Config("accelerate/regression", "accelerate_loop.py", (), right, acc, 16),
        Config(
            "accelerate/plain-backward",
            "accelerate_loop.py",
            ("--variant", "plain-backward"),
            where_accumulating("scale:A"),
            acc,
            16,
            why="loss.backward() for accelerator.backward(loss)",
        ),
        Config(
            "accelerate/prepared-scheduler",
            "accelerate_loop.py",
            ("--scheduler", "prepared"),
            where_ranks("optimizer:settings"),
            acc,
            16,
            why="a scheduler given to accelerator.prepare",
        ),
    ]
    return [
        Config("plain-ddp/padded-lm", "padded_lm.py", (), right, ()),
        Config(
            "plain-ddp/padded-lm/own-mean",
            "padded_lm.py",
            ("--variant", "per-micro-batch"),
            own_mean,
            (),
            why="each micro-batch's own token mean",
        ),
        Config("hf-trainer", "hf_trainer.py", (), _trainer_truth(), hf),
        Config(
            "hf-trainer/own-mean",
            "hf_trainer.py",
            ("--variant", "per-micro-batch"),
            own_mean,
            hf,
            why="a compute_loss with the model's own mean",
        ),
        Config(
            "hf-trainer/tokens-per-device",
            "hf_trainer.py",
            ("--variant", "tokens-per-device"),
            own_mean if _older("transformers", (4, 46)) else where_ranks("ranks:world"),
            hf,
            why="average_tokens_across_devices=False",
        ),
        *accelerate_loops,
        # The same scripts, each layout started as accelerate launch starts a job.
        *(
            dataclasses.replace(
                c, name=c.name.replace("accelerate/", "accelerate-launch/"), launcher="accelerate"
            )
            for c in accelerate_loops
            if c.name != "accelerate/prepared-scheduler"
        ),
        Config("accelerate/padded-lm", "accelerate_lm.py", (), right, acc),
        Config("accelerate/padded-lm/mask", "accelerate_lm.py", ("--mask",), right, acc),
        Config(
            "accelerate/padded-lm/own-mean",
            "accelerate_lm.py",
            ("--variant", "own-mean"),
            own_mean,
            acc,
            why="cross_entropy's own mean per micro-batch",
        ),
        Config("fabric/regression", "fabric_loop.py", (), right, light, 16),
        Config(
            "fabric/no-sampler",
            "fabric_loop.py",
            ("--variant", "no-sampler"),
            where_ranks("data:same-samples"),
            light,
            16,
            why="use_distributed_sampler=False",
        ),
        Config("fabric/padded-lm/mask", "fabric_lm.py", ("--mask",), right, light),
        Config(
            "fabric/padded-lm/own-mean",
            "fabric_lm.py",
            ("--variant", "own-mean"),
            own_mean,
            light,
            why="cross_entropy's own mean per micro-batch",
        ),
        Config(
            "fabric-run/cli",
            "fabric_loop.py",
            ("--configured-by", "cli"),
            right,
            light,
            16,
            launcher="fabric --strategy ddp",
        ),
        Config(
            "fabric-run/cli-under-torchrun",
            "fabric_loop.py",
            ("--configured-by", "cli"),
            where_ranks("launch:no-group"),
            light,
            16,
            why="a script for fabric run (Fabric() from the CLI's flags) started by torchrun",
        ),
        Config("lightning-trainer", "lightning_trainer.py", (), right, light),
        Config(
            "lightning-trainer/injected-sampler",
            "lightning_trainer.py",
            ("--variant", "injected"),
            where_ranks("data:order"),
            light,
            why="Lightning's own DistributedSampler (documented)",
        ),
        Config(
            "lightning-trainer/sum",
            "lightning_trainer.py",
            ("--variant", "sum"),
            everywhere("scale:1/(W*A)"),
            light,
            why="training_step returns the summed loss",
        ),
        Config("trl-sft", "trl_sft.py", (), right, trl),
        Config(
            "trl-sft/tokens-per-device",
            "trl_sft.py",
            ("--variant", "tokens-per-device"),
            where_ranks("ranks:world"),
            trl,
            why="average_tokens_across_devices=False",
        ),
        Config(
            "trl-sft/own-mean",
            "trl_sft.py",
            ("--variant", "own-mean"),
            own_mean,
            trl,
            why="a compute_loss_func with the micro-batch's own mean",
        ),
        Config("grpo-loop", "grpo_loop.py", (), right, ()),
        Config(
            "grpo-loop/kl-per-micro-batch",
            "grpo_loop.py",
            ("--variant", "kl-per-micro-batch"),
            everywhere("grad:differs"),
            (),
            why="the KL term averaged over each micro-batch's own tokens, on every one",
        ),
        Config("trl-sft/padding-free", "trl_sft.py", ("--padding-free",), right, trl),
        Config("trl-sft/packing", "trl_sft.py", ("--packing",), right, trl),
        Config(
            "trl-sft/padding-free/row-mean",
            "trl_sft.py",
            ("--padding-free", "--variant", "row-mean"),
            own_mean,
            trl,
            why="a sequence mean per row where the collator flattens each micro-batch into one",
        ),
    ]


def _missing(config: Config) -> str | None:
    for module in config.needs:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an old release that does not import here counts as absent
            return f"{module} not importable ({type(exc).__name__})"
    return None


def run(config: Config, layouts: tuple[Layout, ...], steps: int) -> dict:
    started = time.monotonic()
    result = run_parity(
        config.command(),
        layouts=list(layouts),
        steps=steps,
        global_batch=config.global_batch,
        launcher=config.launcher,
    )
    if result.verdict.status.value == "error" or len(result.layouts) != len(layouts):
        # A run that failed: its report says why; every cell of it is a wrong answer.
        said = result.report.strip().splitlines()
        cells = {str(x): {"got": "error", "want": config.truth(x), "right": False,
                          "seconds": None} for x in layouts}  # fmt: skip
        return {"name": config.name, "why": config.why, "cells": cells, "finding": None,
                "seconds": round(time.monotonic() - started, 1), "failing_layout": None,
                "global_batch": config.global_batch, "command": config.command(),
                "launcher": config.launcher, "report": result.report,
                "error": " / ".join(said[:3])}  # fmt: skip
    cells = {}
    for row in result.layouts:
        layout = next(x for x in layouts if str(x) == row["layout"])
        want = config.truth(layout)
        said = row["causes"][0] if row["causes"] else None
        got = None if row["verdict"] == "equivalent" else (said or "not equivalent")
        # A finding's code is its pattern; a reading (scale:A) is right for the pattern.
        ok = (want is None and got is None) or (
            want is not None
            and got is not None
            and got.split(":")[0] == want.split(":")[0]
            and (":" not in want or got.startswith(want))
        )
        cells[row["layout"]] = {"got": got, "want": want, "right": ok,
                                "seconds": row.get("seconds")}  # fmt: skip
    failing = next((str(x) for x in layouts if cells[str(x)]["got"]), None)
    first = next((c for c in result.verdict.causes if c.scenario == f"layout {failing}"), None)
    return {
        "name": config.name,
        "why": config.why,
        "cells": cells,
        "seconds": round(time.monotonic() - started, 1),
        "finding": first.text if first else None,
        "failing_layout": failing,
        "global_batch": config.global_batch,
        "command": config.command(),
        "launcher": config.launcher,
        "report": result.report,
    }


def _cell(cell: dict) -> str:
    mark = "" if cell["right"] else " ✗"
    return ("equivalent" if cell["got"] is None else f"`{cell['got']}`") + mark


def table(rows: list[dict], layouts: tuple[Layout, ...]) -> list[str]:
    head = "| configuration | mistake | " + " | ".join(str(x) for x in layouts) + " | time |"
    lines = [head, "|" + " --- |" * (len(layouts) + 3)]
    for row in rows:
        if "skipped" in row:
            cells = " | ".join("—" for _ in layouts)
            lines.append(f"| {row['name']} | {row['why'] or '—'} | {cells} | {row['skipped']} |")
            continue
        cells = " | ".join(_cell(row["cells"][str(x)]) for x in layouts)
        lines.append(f"| {row['name']} | {row['why'] or '—'} | {cells} | {row['seconds']} s |")
    return lines


def releases() -> str:
    names = ("torch", "transformers", "accelerate", "lightning", "trl")
    found = ", ".join(f"{n} {_version(n) or 'absent'}" for n in names)
    return f"Python {platform.python_version()}, {found}"


def reproducer(row: dict, steps: int) -> str:
    layout = row["failing_layout"]
    script = [Path(row["command"][1]).relative_to(ROOT).as_posix(), *row["command"][2:]]
    command = shlex.join(
        ["ddp-verify", "parity", "--layouts", layout, "--global-batch",
         str(row["global_batch"]), "--steps", str(steps),
         *(["--launcher", row["launcher"]] if row["launcher"] != "torchrun" else []),
         "--", "python", *script]
    )  # fmt: skip
    why = row["why"] or "the script as written, no mistake of its own (the framework's, here)"
    return (
        f"#!/bin/sh\n# {row['name']}: {why}.\n# What ddp-verify parity says at layout "
        f"{layout} ({releases()}):\n#   {row['finding']}\n# Run from the repository root.\n"
        f"{command}\n"
    )


PAGE = """# Parity on the frameworks users train with

Each framework fixture of `fixtures/scripts/`, correct and with the mistakes its users make,
run by `ddp-verify parity` at layouts 1x4, 2x2 and 4x1 against one process on the whole
global batch (1x1). A cell is what the tool says at that layout: `equivalent`, or the code of
the first finding it names (the report words it; each configuration the tool finds wrong has
a reproducer under `findings/frameworks/<release set>/`). ✗ marks an answer that is not the
configuration's truth, which is known by how the configuration was written. Configurations
named `accelerate-launch/` and `fabric-run/` start every layout as `accelerate launch` and
`fabric run` do (`--launcher accelerate`, `--launcher 'fabric --strategy ddp'`). Regenerate a
section with `python benchmarks/framework_matrix.py --label LABEL --write docs/frameworks.md
--findings findings/frameworks/LABEL` (what `tox -e frameworks-current` and
`tox -e frameworks-older` run).
"""


def write_section(path: Path, label: str, section: list[str]) -> None:
    """Put ``section`` between the page's markers for ``label`` (made where missing)."""
    begin, end = f"<!-- matrix: {label} -->", f"<!-- end of matrix: {label} -->"
    text = path.read_text() if path.exists() else PAGE
    block = "\n".join([begin, *section, end])
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="*", default=["*"], help="configuration name globs")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--label", default="current", help="the release set's name")
    parser.add_argument("--write", default=None, help="the Markdown page to write")
    parser.add_argument("--findings", default=None, help="the directory for reproducers")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    chosen = [c for c in configs() if any(fnmatch.fnmatch(c.name, g) for g in args.configs)]
    rows: list[dict] = []
    started = time.monotonic()
    print(releases(), flush=True)
    for config in chosen:
        missing = _missing(config)
        if missing:
            rows.append({"name": config.name, "why": config.why, "skipped": missing})
            print(f"{config.name}: skipped, {missing}", flush=True)
            continue
        row = run(config, LAYOUTS, args.steps)
        rows.append(row)
        said = ", ".join(f"{k} {_cell(v)}" for k, v in row["cells"].items())
        print(f"{config.name} ({row['seconds']} s): {said}", flush=True)
        if "error" in row:
            print(f"  {row['error']}", flush=True)
    ran = [r for r in rows if "cells" in r]
    cells = [c for r in ran for c in r["cells"].values()]
    wrong = [c for c in cells if not c["right"]]
    total = round(time.monotonic() - started, 1)
    summary = (
        f"{len(cells) - len(wrong)} of {len(cells)} answers right ({len(ran)} configurations "
        f"x {len(LAYOUTS)} layouts, {len(rows) - len(ran)} skipped), {total} s"
    )
    lines = table(rows, LAYOUTS)
    print("\n" + "\n".join(lines) + "\n\n" + summary)
    if args.write:
        section = [
            f"## {args.label}: {releases()}",
            "",
            f"`tox -e frameworks-{args.label}`; machine: {platform.machine()}, "
            f"{os.cpu_count()} CPUs, gloo; {args.steps} optimizer steps per layout.",
            "",
            *lines,
            "",
            summary,
        ]
        write_section(Path(args.write), args.label, section)
    if args.findings:
        directory = Path(args.findings)
        directory.mkdir(parents=True, exist_ok=True)
        for row in ran:
            if row["failing_layout"]:
                path = directory / (row["name"].replace("/", "--") + ".sh")
                path.write_text(reproducer(row, args.steps))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
