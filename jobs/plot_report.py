#!/usr/bin/env python3
"""Plots of a `shardlm run` result file, for `shardlm report --plots DIR`.

usage: plot_report.py RESULTS.h5 OUTDIR

Writes into OUTDIR (created if needed):
  throughput.png    output tokens of the requests finished in each time bin, per second (by replica)
  latency_hist.png  histograms of TTFT and TPOT with p50/p90/p99 marked
  steps.png         batch size and KV blocks used per scheduler step over time (by replica)
  replicas.png      requests in flight (queued..finished) and decoding (first token..finished) per
                    replica over time
  stages.png        each pipeline stage's compute and communication time per step (mean over the steps
                    with stage figures; files from before /steps/stage_* have none and get no plot)
  experts.png       mixture-of-experts runs only (a non-empty /steps/expert_tokens row): a heatmap of
                    the tokens routed to each expert per step (steps binned when there are many) and
                    a bar chart of the tokens per expert over the run

Latencies follow shardlm report: requests without error that produced tokens; TTFT = t_first_token -
t_queued; TPOT = (t_finished - t_first_token) / (n - 1) for n > 1 tokens.

Each PNG written is printed on its own line on stdout; messages go to stderr. Exit codes: 0 done,
2 bad usage or unreadable file, 3 h5py or matplotlib (or numpy) missing.
"""
import os
import sys

EXIT_USAGE = 2
EXIT_MISSING_DEPS = 3


def log(msg):
    print(f"plot_report.py: {msg}", file=sys.stderr)


def attr_str(f, name, default=""):
    v = f.attrs.get(name, default)
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def read_column(group, name):
    if name not in group:
        raise KeyError(f"no /requests/{name} column")
    return group[name][()]


def load(path, np, h5py):
    with h5py.File(path, "r") as f:
        meta = {
            "layout": attr_str(f, "layout"),
            "wall": float(f.attrs["wall_seconds"]) if "wall_seconds" in f.attrs else None,
        }
        if "requests" not in f:
            raise ValueError(f"{path} has no /requests group: not written by shardlm run")
        rq = f["requests"]
        req = {}
        for c in ("t_queued", "t_first_token", "t_finished", "replica"):
            req[c] = np.asarray(read_column(rq, c), dtype=float if c != "replica" else int)
        req["error"] = np.array([e != "" for e in rq["error"].asstr()[()]], dtype=bool)
        req["n_out"] = np.array([len(x) for x in rq["output_tokens"][()]], dtype=int)
        n = min(len(v) for v in req.values())  # a crash can leave columns of unequal length
        req = {k: v[:n] for k, v in req.items()}
        steps = None
        if "steps" in f and "t_start" in f["steps"]:
            sg = f["steps"]
            # The variable-length columns (a list per step) are read as lists.
            lists = ("expert_tokens", "stage_compute_s", "stage_comm_s")
            steps = {c: (list(sg[c][()]) if c in lists else np.asarray(sg[c][()])) for c in sg.keys()}
            m = min(len(v) for v in steps.values())
            steps = {k: v[:m] for k, v in steps.items()}
    return meta, req, steps


def expert_matrix(np, steps):
    """(tokens [experts x steps with a non-empty expert_tokens row], their order by t_start), or None
    when no step has expert counts (a dense model, or a file written before the column existed)."""
    if steps is None or "expert_tokens" not in steps:
        return None
    rows = [(i, np.asarray(r, dtype=np.int64)) for i, r in enumerate(steps["expert_tokens"]) if len(r)]
    if not rows:
        return None
    n_exp = max(len(r) for _, r in rows)
    load = np.zeros((n_exp, len(rows)), dtype=np.int64)
    for j, (_, r) in enumerate(rows):
        load[: len(r), j] = r
    t = np.asarray([steps["t_start"][i] for i, _ in rows], dtype=float)
    return load, np.argsort(t, kind="stable")


def percentile(np, v, q):
    return float(np.percentile(v, q)) if len(v) else 0.0  # numpy's default is linear, as shardlm's


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return EXIT_USAGE
    path, outdir = argv[1], argv[2]
    try:
        import numpy as np
        import h5py
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"needs numpy, h5py and matplotlib ({e}); install them with: pip install h5py matplotlib")
        return EXIT_MISSING_DEPS
    if not os.path.isfile(path):
        log(f"cannot open result file '{path}': no such file")
        return EXIT_USAGE
    try:
        meta, req, steps = load(path, np, h5py)
    except (OSError, ValueError, KeyError) as e:
        log(f"cannot read result file '{path}': {e}")
        return EXIT_USAGE
    os.makedirs(outdir, exist_ok=True)

    title = os.path.basename(path) + (f"  ({meta['layout']})" if meta["layout"] else "")
    replicas = sorted(set(req["replica"].tolist()) | (set(steps["replica"].tolist()) if steps else set()))
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(replicas)}
    ok = (~req["error"]) & (req["n_out"] > 0)
    written = []

    def save(fig, name):
        p = os.path.join(outdir, name)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
        print(p, flush=True)

    def no_data(ax, text):
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")

    # ---- throughput over time: output tokens finished per second, binned, stacked by replica ----
    wall = meta["wall"] if meta["wall"] else (float(req["t_finished"].max()) if len(req["t_finished"]) else 0.0)
    wall = max(wall, float(req["t_finished"].max()) if len(req["t_finished"]) else 0.0)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    if wall > 0 and req["n_out"].sum() > 0:
        nbins = int(min(60, max(5, len(req["t_finished"]) // 2)))
        edges = np.linspace(0, wall, nbins + 1)
        width = edges[1] - edges[0]
        bottom = np.zeros(nbins)
        for r in replicas:
            sel = req["replica"] == r
            tok, _ = np.histogram(req["t_finished"][sel], bins=edges, weights=req["n_out"][sel])
            ax.bar(edges[:-1], tok / width, width=width, bottom=bottom, align="edge", color=colors[r],
                   edgecolor="white", linewidth=0.3, label=f"replica {r}" if len(replicas) > 1 else None)
            bottom += tok / width
        mean = req["n_out"].sum() / wall
        ax.axhline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.1f} tok/s")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    else:
        no_data(ax, "no output tokens")
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("output tokens finished / s")
    ax.set_title(f"Throughput: {title}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, "throughput.png")

    # ---- TTFT and TPOT histograms ----
    ttft = (req["t_first_token"] - req["t_queued"])[ok] * 1e3
    multi = ok & (req["n_out"] > 1)
    tpot = ((req["t_finished"] - req["t_first_token"])[multi] / (req["n_out"][multi] - 1)) * 1e3
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, v, name in ((axes[0], ttft, "TTFT"), (axes[1], tpot, "TPOT")):
        if len(v):
            ax.hist(v, bins=min(40, max(5, len(v) // 2)), color="tab:blue", alpha=0.75)
            for q, style in ((50, "-"), (90, "--"), (99, ":")):
                x = percentile(np, v, q)
                ax.axvline(x, color="tab:red", linestyle=style, linewidth=1.2, label=f"p{q} {x:.2f} ms")
            ax.legend(fontsize=8, loc="best", framealpha=0.9)
        else:
            no_data(ax, "no samples")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("requests")
        ax.set_title(f"{name}, n={len(v)}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, "latency_hist.png")

    # ---- per step: batch size and KV blocks over time (queue depths too, when recorded) ----
    queue = steps is not None and "waiting" in steps and "running" in steps
    fig, axes = plt.subplots(3 if queue else 2, 1, figsize=(9, 7.5 if queue else 5.5), sharex=True)
    panels = [("batch_size", "batch size"), ("kv_blocks_used", "KV blocks used")]
    for ax, (col, label) in zip(axes, panels):
        if steps is not None and len(steps["t_start"]) and col in steps:
            for r in replicas:
                sel = steps["replica"] == r
                if sel.any():
                    order = np.argsort(steps["t_start"][sel])
                    ax.step(steps["t_start"][sel][order], steps[col][sel][order], where="post", color=colors[r],
                            linewidth=1, label=f"replica {r}")
            if len(replicas) > 1:
                ax.legend(fontsize=8, loc="upper right")
        else:
            no_data(ax, "no steps recorded")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if queue:
        ax = axes[2]
        for r in replicas:
            sel = steps["replica"] == r
            order = np.argsort(steps["t_start"][sel])
            t = steps["t_start"][sel][order]
            ax.step(t, steps["running"][sel][order], where="post", color=colors[r], linewidth=1,
                    label=f"running r{r}")
            ax.step(t, steps["waiting"][sel][order], where="post", color=colors[r], linewidth=1, linestyle="--",
                    label=f"waiting r{r}")
        ax.legend(fontsize=8, loc="upper right")
        ax.set_ylabel("sequences")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step start, time since run start (s)")
    axes[0].set_title(f"Scheduler steps: {title}", fontsize=10)
    fig.tight_layout()
    save(fig, "steps.png")

    # ---- per-replica timelines: requests in flight ----
    def in_flight(start, end):
        # +1 at start, -1 at end; at equal times the end comes first (an error row never counts).
        t = np.concatenate([start, end])
        d = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
        order = np.lexsort((d, t))
        return np.concatenate([[0.0], t[order]]), np.concatenate([[0.0], np.cumsum(d[order])])

    shown = replicas if replicas else [0]
    rows = len(shown) if len(shown) <= 8 else 1
    fig, axes = plt.subplots(rows, 1, figsize=(9, 1.9 * rows + 1.2), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for i, r in enumerate(shown):
        ax = axes[i if rows > 1 else 0]
        sel = req["replica"] == r
        if sel.any():
            t, n = in_flight(req["t_queued"][sel], req["t_finished"][sel])
            ax.step(t, n, where="post", color=colors.get(r, "tab:blue"), linewidth=1.2,
                    label="in flight (queued..finished)" if rows > 1 else f"replica {r} in flight")
            dec = sel & ok
            t, n = in_flight(req["t_first_token"][dec], req["t_finished"][dec])
            ax.fill_between(t, n, step="post", color=colors.get(r, "tab:blue"), alpha=0.25, linewidth=0,
                            label="decoding (first token..finished)" if rows > 1 else f"replica {r} decoding")
        else:
            no_data(ax, "no requests")
        if rows > 1:
            ax.set_ylabel(f"replica {r}")
        if i == 0 or rows > 1:
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper right")
    if rows == 1:
        axes[0].set_ylabel("requests")
    axes[-1].set_xlabel("time since run start (s)")
    axes[0].set_title(f"Requests in flight per replica: {title}", fontsize=10)
    fig.tight_layout()
    save(fig, "replicas.png")

    # ---- pipeline stages: compute and communication per step ----
    if steps is not None and "stage_compute_s" in steps and "stage_comm_s" in steps:
        timed = [i for i, row in enumerate(steps["stage_compute_s"]) if len(row)]
        if timed:
            n_st = max(len(steps["stage_compute_s"][i]) for i in timed)
            compute, comm = np.zeros(n_st), np.zeros(n_st)
            for i in timed:
                c, m = steps["stage_compute_s"][i], steps["stage_comm_s"][i]
                compute[:len(c)] += c
                comm[:len(m)] += m
            scale = 1e3 / len(timed)
            wall = float(np.sum(steps["wall_s"][timed])) * scale
            fig, ax = plt.subplots(figsize=(9, max(2.5, 1.2 + 0.5 * n_st)))
            y = np.arange(n_st)
            ax.barh(y, compute * scale, color="tab:blue", height=0.6, label="compute")
            ax.barh(y, comm * scale, left=compute * scale, color="tab:orange", height=0.6,
                    label="communication (waits included)")
            ax.axvline(wall, color="black", linestyle="--", linewidth=1, label=f"step wall {wall:.3f} ms")
            ax.set_yticks(y)
            ax.set_yticklabels([f"stage {k}" for k in y])
            ax.invert_yaxis()
            ax.set_xlabel(f"ms per step (mean over {len(timed)} steps; each stage's tp rank 0)")
            ax.set_title(f"Step time by pipeline stage: {title}", fontsize=10)
            ax.legend(fontsize=8, loc="lower right")
            ax.grid(axis="x", alpha=0.3)
            fig.tight_layout()
            save(fig, "stages.png")

    # ---- mixture of experts: tokens per expert over the steps, and over the run ----
    experts = expert_matrix(np, steps)
    if experts is not None:
        counts, order = experts
        n_exp, n_steps = counts.shape
        # Steps in run order (by start time); at most 200 columns: bins of consecutive steps summed.
        counts = counts[:, order]
        cols = min(n_steps, 200)
        edges = np.linspace(0, n_steps, cols + 1).round().astype(int)
        binned = np.add.reduceat(counts, edges[:-1], axis=1) if n_steps else counts
        per_bin = np.diff(edges)
        fig, axes = plt.subplots(1, 2, figsize=(12, max(3.5, min(9.0, 1.5 + 0.12 * n_exp))),
                                 gridspec_kw={"width_ratios": [3, 1]})
        ax = axes[0]
        # A square-root colour scale: prefill steps route many more tokens than decode steps.
        im = ax.imshow(binned, aspect="auto", origin="lower", interpolation="nearest", cmap="viridis",
                       norm=matplotlib.colors.PowerNorm(gamma=0.5, vmin=0, vmax=max(1, int(binned.max()))),
                       extent=(0, n_steps, -0.5, n_exp - 0.5))
        fig.colorbar(im, ax=ax, label="tokens" + (" per bin" if cols < n_steps else ""), fraction=0.05, pad=0.02)
        ax.set_xlabel("step (all engine groups, in start-time order)" +
                      (f"; bins of {per_bin.min()}-{per_bin.max()} steps" if cols < n_steps else ""))
        ax.set_ylabel("expert")
        ax.set_title(f"Tokens routed per expert: {title}", fontsize=10)
        totals = counts.sum(axis=1)
        ax = axes[1]
        mean = totals.mean() if n_exp else 0.0
        ax.barh(np.arange(n_exp), totals, color=["tab:red" if t == 0 else "tab:blue" for t in totals], height=0.8)
        ax.axvline(mean, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(-0.5, n_exp - 0.5)
        ax.set_xlabel("tokens over the run")
        ax.set_title(f"{n_exp} experts, {int((totals == 0).sum())} idle\nmean {mean:.0f} (dashed)" +
                     (f", max/mean {totals.max() / mean:.2f}" if mean > 0 else ""), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        save(fig, "experts.png")

    log(f"wrote {len(written)} plots into {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
