"""MoEBERT at base width (benchmarks/base.py ``--only dispatch`` and ``--only bound``): one FFN layer's batched
dispatch against a dense FFN of one expert's width and against two floors of its own, and the whole model against
its no-routing bound in small processes, beside a copy of it that skips the dispatch's data movement."""

from __future__ import annotations

import json
import time
from pathlib import Path


def loop_dispatch(ffn, flat, expert):
    """The rejected alternative, written out: a loop over the experts, each on its own tokens (index_select,
    one matmul pair, index_copy back)."""
    import torch

    out = torch.empty_like(flat)
    for e in range(ffn.num_experts):
        rows = (expert == e).nonzero().squeeze(1)
        out.index_copy_(0, rows, ffn.expert(flat.index_select(0, rows), e))
    return out


def expert_matmuls(ffn, slots, rows: int):
    """The batched dispatch's expert matmuls alone, on slots already in place (no gather, no read-back):
    what any dispatch of those slots costs at least. slots: (N, cap, d); the first ``rows`` output rows."""
    return ffn.experts_batched(slots).flatten(0, 1)[:rows]


def matmuls_only(ffn, slots, flat):
    """One MoE FFN layer with no data movement: :func:`expert_matmuls` plus the shared block."""
    return expert_matmuls(ffn, slots, flat.shape[0]).addmm_(ffn.shared_hidden(flat), ffn.shared_w2)


def without_data_movement(moe):
    """A copy of MoEBERT whose experts skip the gather and the read-back: their matmuls run on a zero slot
    buffer of the routing's own capacity. Its outputs are wrong; its time is MoEBERT's with a free dispatch."""
    import copy
    import types

    from distillery.moebert.experts import MoEFeedForward

    def dispatch(ffn, flat, plan):
        if plan.capacity not in ffn.slot_buffers:
            ffn.slot_buffers[plan.capacity] = flat.new_zeros(ffn.num_experts, plan.capacity, flat.shape[1])
        return expert_matmuls(ffn, ffn.slot_buffers[plan.capacity], flat.shape[0])

    out = copy.deepcopy(moe)
    for ffn in out.modules():
        if isinstance(ffn, MoEFeedForward):
            ffn.slot_buffers = {}
            ffn._dispatch = types.MethodType(dispatch, ffn)
    return out


def bound_records(folder: Path, repeats: int, latency_runs: int, lengths: tuple[int, ...] = (128,)) -> list[dict]:
    """MoEBERT (the run in ``folder``) against its no-routing bound in processes of their own: the teacher,
    MoEBERT, MoEBERT without data movement and the bound, ``repeats`` times; one record per process and sequence
    length (batch 1, 2 threads). Longer sequences give every expert more rows: 1×128 puts ~32 tokens on each of 4."""
    from moebert import narrow_ffn

    from distillery.bench import hardware_fingerprint, latency_ms
    from distillery.runtime import load_model

    teacher = load_model(json.loads((folder / "train.json").read_text())["teacher_path"])
    moe = load_model(folder / "student")
    models = {"teacher": teacher, "moebert": moe, "moebert, no data movement": without_data_movement(moe),
              "no-routing bound": narrow_ffn(teacher, moe.config.expert_size)}
    threads, records = 2, []
    for _ in range(repeats):
        for seq in lengths:
            ms = latency_ms(models, shape=(1, seq), runs=latency_runs, warmup=3, threads=threads)
            records.append({"seq": seq, "latency_ms": ms, "hardware": {**hardware_fingerprint("cpu"), "threads": threads},
                            "share": ms["no-routing bound"] / ms["moebert"],
                            "share_no_data_movement": ms["no-routing bound"] / ms["moebert, no data movement"]})
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in records[-1].items() if k != "hardware"})
    return records


def bound_lines(records: list[dict]) -> list[str]:
    """The processes of ``--only bound``, fastest teacher first: the share moves with the machine's speed (1×128),
    and with the tokens each expert gets (longer sequences)."""
    seq = lambda r: r.get("seq", 128)  # the first processes timed 1×128 only
    short = sorted((r for r in records if seq(r) == 128), key=lambda r: r["latency_ms"]["teacher"])
    cells = [f"teacher {r['latency_ms']['teacher']:.0f} ms: {r['share']:.3f} ({r['share_no_data_movement']:.3f})"
             for r in short]
    lines = ["MoEBERT against its bound in processes of their own (benchmarks/base.py --only bound; the teacher, "
             "MoEBERT, MoEBERT without the dispatch's gather and read-back, and the bound; 2 threads, 1×128), by the "
             "teacher's latency in that process: MoEBERT's share of the bound (without data movement): "
             + "; ".join(cells) + "."]
    longer = sorted({seq(r) for r in records} - {128})
    if longer:
        by_seq = [f"1×{n}: " + ", ".join(f"{r['share']:.3f}" for r in records if seq(r) == n) for n in longer]
        lines.append("The same processes at longer sequences (batch 1; every expert gets more rows): MoEBERT's share "
                     "of the bound at " + "; ".join(by_seq) + ".")
    return lines


def dispatch_records(thread_counts: list[int], runs: int) -> list[dict]:
    """One FFN layer alone at 1x128 and 8x128 tokens, hidden 384 (MiniLM) and 768 (base): a dense FFN of one
    expert's width (the no-routing bound), the batched dispatch the model uses, the per-expert loop, and two
    floors of the batched dispatch, its matmuls alone on slots already in place: with the routing's padded
    capacity (no dispatch of these tokens costs less) and with every expert given the same share of the tokens
    (no padding either); all interleaved, medians of ``runs``."""
    import statistics

    import torch

    from distillery.moebert.experts import MoEFeedForward, plan_dispatch
    from distillery.moebert.modeling_moebert import shared_default

    records = []
    for d, d_h in ((384, 1536), (768, 3072)):
        n, d_e = 4, d_h // 4
        s = shared_default(d_h)
        ffn = MoEFeedForward(d, n, d_e - s, s, "gelu").eval()
        w1, w2 = torch.randn(d, d_e) * 0.02, torch.randn(d_e, d) * 0.02
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for tokens in (128, 1024):
                flat = torch.randn(tokens, d)
                expert = torch.randint(0, n, (tokens,))
                plan = plan_dispatch(expert[None], n)[0]  # the model plans every layer at once, before the first
                padded = torch.randn(n, plan.capacity, d)
                balanced = flat.view(n, tokens // n, d)
                variants = {
                    "dense": lambda: torch.nn.functional.gelu(flat @ w1) @ w2,
                    "batched": lambda: ffn(flat[None], plan),
                    "loop": lambda: loop_dispatch(ffn, flat, expert).addmm_(ffn.shared_hidden(flat), ffn.shared_w2),
                    "padded floor": lambda: matmuls_only(ffn, padded, flat),
                    "balanced floor": lambda: matmuls_only(ffn, balanced, flat),
                }
                times = {k: [] for k in variants}
                with torch.inference_mode():
                    for _ in range(runs):
                        for k, f in variants.items():
                            t = time.perf_counter()
                            f()
                            times[k].append(1e3 * (time.perf_counter() - t))
                ms = {k: statistics.median(v) for k, v in times.items()}
                records.append({"hidden": d, "ffn": d_h, "expert_size": d_e, "shared": s, "threads": threads,
                                "tokens": tokens, "capacity": plan.capacity, "ms": ms})
                print(records[-1], flush=True)
    return records


def dispatch_lines(records: list[dict]) -> list[str]:
    header = ("| hidden | d_e (shared) | threads | tokens | dense d_e (ms) | batched dispatch (ms) | per-expert loop (ms) | "
              "batched ÷ dense | padded floor ÷ dense (busiest expert) | balanced floor ÷ dense |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        ms = r["ms"]
        floors = (f"{ms['padded floor'] / ms['dense']:.2f} ({r['capacity']} of {r['tokens']}) | "
                  f"{ms['balanced floor'] / ms['dense']:.2f}") if "padded floor" in ms else "— | —"
        lines.append(f"| {r['hidden']} | {r['expert_size']} ({r['shared']}) | {r['threads']} | {r['tokens']} | "
                     f"{ms['dense']:.3f} | {ms['batched']:.3f} | {ms['loop']:.3f} | {ms['batched'] / ms['dense']:.2f} | "
                     f"{floors} |")
    return lines
