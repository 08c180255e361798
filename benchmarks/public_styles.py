"""Verdict, cause and call for code written in the styles of public implementations (our own
equivalents in fixtures/, not their code), as a new user would check them: world size 4, 25
examples, the options each one needs.

    python benchmarks/public_styles.py [--world-size 4] [--examples 25] [--plain] [--out F]
                                       [--cases NAME ...]

``--plain`` drops the options an older ddp_verify lacks (--bind, --labels, --logits), to
measure a tree from before they existed. Prints one line per case and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
F = "fixtures/real_style"
POWERSGD = f"{F}/powersgd_hooks.py"

# (name, the style it is written in, target, kind, options, options only a newer tree has)
CASES = [
    ("masked_lm_loss", "HF ForMaskedLMLoss", f"{F}/lm_losses.py:masked_lm_loss", "loss-fn",
     ["--losses", "tokens"], []),
    ("causal_lm_loss", "HF ForCausalLMLoss", f"{F}/causal_lm_losses.py:causal_lm_loss",
     "loss-fn", ["--losses", "tokens"], ["--labels", "unshifted"]),
    ("cross_entropy_loss", "torchtitan/litgpt cross_entropy_loss",
     f"{F}/lm_losses.py:cross_entropy_loss", "loss-fn", ["--losses", "tokens"], []),
    ("powerSGD_hook rank 1", "torch powerSGD_hook, start_powerSGD_iter=1",
     f"{POWERSGD}:powerSGD_hook", "comm-hook",
     ["--hook-state", f"{POWERSGD}:rank_one_from_step_one"], []),
    ("powerSGD_hook rank 1, --lossy bf16", "as advised", f"{POWERSGD}:powerSGD_hook",
     "comm-hook", ["--hook-state", f"{POWERSGD}:rank_one_from_step_one", "--lossy", "bf16"], []),
    ("powerSGD_hook, unused parameter", "torch powerSGD_hook x find_unused_parameters",
     f"{POWERSGD}:powerSGD_hook", "comm-hook",
     ["--hook-state", f"{POWERSGD}:compressing_everything", "--timeout", "20"], []),
    ("reduce_tensor(tensor, n)", "timm reduce_tensor", f"{F}/bound_helpers.py:reduce_tensor",
     "reduce", [], ["--bind", "n=world_size"]),
    ("average_losses (tensor out)", "Megatron average_losses_across_data_parallel_group",
     f"{F}/list_helpers.py:average_losses_as_one_tensor", "reduce", [], []),
    ("all_reduce_dict(data, device, group)", "fairseq all_reduce_dict",
     f"{F}/reduce_dict_helpers.py:all_reduce_dict", "reduce-dict", [], []),
    ("reduce_dict", "detectron2 reduce_dict", f"{F}/reduce_dict_helpers.py:reduce_dict",
     "reduce-dict", [], []),
    ("gpt_accumulation", "nanoGPT accumulation loop", f"{F}/nanogpt_steps.py:gpt_accumulation",
     "wrapped-step", [], []),
    ("step_per_micro_batch", "optimizer stepped per micro-batch",
     "fixtures/step.py:step_per_micro_batch", "step", [], []),
    ("summed_and_reported", "DDP fed a per-rank summed loss",
     f"{F}/sum_loss_like_gradient.py:summed_and_reported", "wrapped-step",
     ["--loss-reduction", "sum", "--max-micro-batches", "1"], []),
    ("step_with_running_loss", "a module-level running loss",
     f"{F}/stateful_steps.py:step_with_running_loss", "wrapped-step", [], []),
    ("sync_with_cached_buffer", "a flat buffer cached on the first call",
     f"{F}/cached_grad_sync.py:sync_with_cached_buffer", "grad-sync", [], []),
    ("weight_by_sequences", "ranks weighted by sequences under a token loss",
     f"{F}/token_grad_sync.py:weight_by_sequences", "grad-sync", ["--losses", "tokens"], []),
]  # fmt: skip


def run(case: tuple, world_size: int, examples: int, plain: bool, cwd: Path) -> dict:
    name, style, target, kind, options, newer = case
    # Paths in options (--hook-state) from the repository, whatever the working directory.
    options = [str(ROOT / o) if o.startswith("fixtures/") else o for o in options]
    command = [
        sys.executable, "-m", "ddp_verify", "check", str(ROOT / target), "--kind", kind,
        "--world-size", str(world_size), "--max-examples", str(examples), "--seed", "0",
        "--json", *options, *([] if plain else newer),
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=cwd)
    seconds = time.monotonic() - started
    try:
        verdict = json.loads(result.stdout)
    except json.JSONDecodeError:
        verdict = {"verdict": f"no JSON (exit {result.returncode})", "report": result.stderr}
    row = {
        "case": name,
        "style": style,
        "verdict": verdict.get("verdict"),
        "exit_code": result.returncode,
        "call": verdict.get("call"),
        "causes": [
            c.get("reading") or c.get("pattern") for c in verdict.get("likely_causes") or []
        ],
        "cause": verdict.get("likely_cause")
        or (verdict.get("report") or "").strip().splitlines()[-1:],
        "precision": verdict.get("precision"),
        "seconds": round(seconds, 1),
    }
    reproducer = verdict.get("reproducer")
    if reproducer and Path(cwd, reproducer).is_file():
        replay = subprocess.run(
            [sys.executable, "-W", "ignore", reproducer],
            capture_output=True, text=True, timeout=600, cwd=cwd,
        )  # fmt: skip
        row["reproducer_exit"] = replay.returncode
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--cases", nargs="*", help="only the cases whose names start so")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/public_styles.json")
    args = parser.parse_args()
    work = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    rows = []
    for case in CASES:
        if args.cases and not any(case[0].startswith(c) for c in args.cases):
            continue
        row = run(case, args.world_size, args.examples, args.plain, work)
        rows.append(row)
        cause = row["cause"] if isinstance(row["cause"], str) else " ".join(row["cause"])
        print(
            f"{row['case']}: {row['verdict']} (exit {row['exit_code']}, {row['seconds']} s) "
            f"patterns={row['causes']} precision={row['precision']} "
            f"reproducer_exit={row.get('reproducer_exit')}\n  call: {row['call']}\n"
            f"  cause: {cause[:300]}",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
