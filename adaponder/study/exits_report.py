"""The reasoning report's section on per-pass supervision and exit rules (docs/method.md A21–A24): what each pass
answers (the per-pass probe), every exit rule each arm can run, and the goals judged on the study's intervals
(runs × query symbols, :mod:`.intervals`) against ``ponderlm``.

Rules per arm: ``all passes`` (the arm's own forward: no early exit), ``Q-exit`` (arms with halting heads, A21,
q = 0.5, and, where the arm was evaluated over a grid of q, at the q chosen on the development split, A25), ``consistency δ`` (arms with consistency heads, A23, the threshold calibrated on the development split),
``learned gates`` (AdaPonder arms, τ = 1e-4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean

from . import intervals
from .q_choice import LEVELS, MARGIN, QChoice, choose_q

REFERENCE = "ponderlm"
#: The goals' bounds (the issue's numbers): FLOPs per answer token at most this share of ``ponderlm``'s, mean exit
#: within this of H for H ≤ 2, query symbols and filler leaving by this pass on average.
FLOPS_SHARE, EXIT_SLACK, EARLY_PASS = 0.70, 0.5, 1.5


def _by_arm(results: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    out: dict[str, list[Mapping]] = {}
    for r in results:
        out.setdefault(r["arm"], []).append(r)
    return out


def rules_of(run: Mapping) -> list[tuple[str, Mapping]]:
    """``(rule name, difficulty evaluation)`` for every exit rule this run was evaluated with."""
    rules = []
    if run.get("mode") == "adaponder":
        rules.append(("learned gates", run["difficulty"]))
        if run.get("difficulty_no_halting"):
            rules.append(("all passes", run["difficulty_no_halting"]))
    else:
        rules.append(("all passes", run["difficulty"]))
    if run.get("difficulty_q_exit"):
        rules.append(("Q-exit (q = 0.5)", run["difficulty_q_exit"]))
    if run.get("difficulty_consistency"):
        delta = (run.get("consistency_exit") or {}).get("delta")
        rules.append((f"consistency (δ = {delta:g})" if delta else "consistency", run["difficulty_consistency"]))
    return rules


def _hs(results: Sequence[Mapping]) -> list[int]:
    return [lv["difficulty"] for lv in results[0]["difficulty"]["levels"]]


def _cls_exit(d: Mapping, name: str) -> float:
    return float((d["classes"].get(name) or {}).get("mean_exit") or float("nan"))


def _answer_flops(d: Mapping) -> float:
    return float(((d["classes"].get("answer") or {}).get("flops") or {}).get("total", float("nan")))


def best_adaponder(arms: Mapping[str, Sequence[Mapping]]) -> str | None:
    """The gated arm with the highest mean two-hop accuracy under its learned gates."""
    gated = {a: runs for a, runs in arms.items() if runs[0].get("mode") == "adaponder"}
    if not gated:
        return None
    return max(gated, key=lambda a: mean(r["difficulty"]["levels"][1]["accuracy"] for r in gated[a]))


def _ps(runs: Sequence[Mapping], key: str | None) -> list[Mapping]:
    return [(r if key is None else r[key])["per_symbol"] for r in runs]


def section(results: Sequence[Mapping], verdicts: bool = True) -> list[str]:
    shown = [r for r in results if r.get("difficulty") and r["difficulty"].get("per_symbol")]
    arms = _by_arm(shown)
    new = {a: runs for a, runs in arms.items() if any(r.get("pass_probe") for r in runs)}
    if not new or REFERENCE not in arms:
        return []
    hs = _hs(shown)
    head = " | ".join(f"H={h}" for h in hs)
    L = ["## Exits that know the answer: per-pass supervision, exit rules and the draft\n",
         "Arms of docs/method.md A21–A24 beside `ponderlm`"
         + (f" and the best AdaPonder arm (`{best_adaponder(arms)}`, by two-hop accuracy)" if best_adaponder(arms)
            else "") + ". Accuracies are means over runs with 95 % intervals over runs × query symbols; FLOPs per "
         "answer token count the gates and the pass heads (A17) of the answer tokens (the goals' measure); FLOPs per token "
         "(all tokens) those of every token of the documents.\n",
         "### The per-pass probe\n",
         "Greedy answer of pass i (passes 1..i run, no exit), test split, mean over runs.\n",
         f"| arm | runs | pass | {head} |", "|---|---:|---:|" + "---:|" * len(hs)]
    for arm, runs in new.items():
        probes = [r["pass_probe"] for r in runs if r.get("pass_probe")]
        for i in range(len(probes[0])):
            cells = " | ".join(f"{mean(p[i]['levels'][j]['accuracy'] for p in probes):.3f}" for j in range(len(hs)))
            L.append(f"| {arm} | {len(probes)} | {i + 1} | {cells} |")
    ref = arms[REFERENCE]
    ref_flops = mean(_answer_flops(r["difficulty"]) for r in ref)
    compared = dict(new)
    best = best_adaponder(arms)
    if best:
        compared[best] = arms[best]
    L += ["", "### Every exit rule\n",
          f"| arm | rule | runs | {head} | exit H=1 | exit H=2 | query symbol | filler | FLOPs/answer × ponderlm | "
          "FLOPs/token (all tokens) × ponderlm |",
          "|---|---|---:|" + "---:|" * len(hs) + "---:|---:|---:|---:|---:|---:|"]
    ref_cells = " | ".join(str(intervals.bootstrap(_ps(ref, "difficulty"), intervals.accuracy(h))) for h in hs)
    L.append(f"| {REFERENCE} | all passes | {len(ref)} | {ref_cells} | 4.00 | 4.00 | 4.00 | 4.00 | 1.00 | 1.00 |")
    ref_all = mean(float(r["difficulty"]["flops"]["total"]) for r in ref)
    judged = []
    choices = {arm: c for arm in compared if (c := choose_q(results, arm, REFERENCE)) is not None}
    for arm, runs in compared.items():
        named = [(name, [dict(rules_of(r))[name] for r in runs if name in dict(rules_of(r))])
                 for name, _ in rules_of(runs[0])]
        if arm in choices:  # the test split read once, at the q chosen on the development split
            named.append((_chosen_name(choices[arm]), choices[arm].test_runs(runs)))
        for name, ds in named:
            accs = [intervals.bootstrap([d["per_symbol"] for d in ds], intervals.accuracy(h)) for h in hs]
            ex = [mean(d["levels"][j]["mean_exit"] for d in ds) for j in range(2)]
            q, f = mean(_cls_exit(d, "query_symbol") for d in ds), mean(_cls_exit(d, "filler") for d in ds)
            share = mean(_answer_flops(d) for d in ds) / ref_flops
            every = mean(float(d["flops"]["total"]) for d in ds) / ref_all
            L.append(f"| {arm} | {name} | {len(ds)} | " + " | ".join(map(str, accs))
                     + f" | {ex[0]:.2f} | {ex[1]:.2f} | {q:.2f} | {f:.2f} | {share:.2f} | {every:.2f} |")
            judged.append((arm, name, ds, accs, ex, q, f, share))
    L += _choice_table(choices, verdicts)
    if not verdicts:
        return L + [""]
    L += ["", "### Goals\n", "| goal | numbers | verdict |", "|---|---|---|"]
    ref_iv = [intervals.bootstrap(_ps(ref, "difficulty"), intervals.accuracy(h)) for h in hs]
    for arm, runs in new.items():  # the supervision options and the draft keep two-hop accuracy
        name, d_runs = _own_rule(runs, choices.get(arm))
        diff = intervals.difference([d["per_symbol"] for d in d_runs], _ps(ref, "difficulty"), intervals.accuracy(2))
        own = intervals.bootstrap([d["per_symbol"] for d in d_runs], intervals.accuracy(2))
        inside = ref_iv[1].low <= own.mean <= ref_iv[1].high
        L.append(f"| `{arm}` keeps `ponderlm`'s two-hop accuracy ({name}) | {own} against {ref_iv[1]}; difference "
                 f"{diff} | **{'met' if inside else 'not met'}**{'' if inside else f': costs {-diff.mean:.3f}'} |")
    for arm, runs in new.items():  # pass i answers H = i
        probes = [r["pass_probe"] for r in runs if r.get("pass_probe")]
        diag = [mean(p[i]["levels"][i]["accuracy"] for p in probes) for i in range(min(len(probes[0]), len(hs)))]
        ok = all(a >= ref_iv[i].low for i, a in enumerate(diag))
        L.append(f"| `{arm}`: pass i answers H = i | pass-i accuracy at H = i: "
                 + ", ".join(f"{a:.3f}" for a in diag) + f" (ponderlm's lower bounds "
                 + ", ".join(f"{iv.low:.3f}" for iv in ref_iv) + f") | **{'met' if ok else 'not met'}** |")
    adaptive = [j for j in judged if j[1] != "all passes"]
    for arm, name, ds, accs, ex, q, f, share in adaptive:
        within = all(a.mean >= iv.low for a, iv in zip(accs, ref_iv))
        exits = all(abs(e - h) <= EXIT_SLACK for e, h in zip(ex, hs[:2]))
        ok = within and share <= FLOPS_SHARE and exits and q <= EARLY_PASS and f <= EARLY_PASS
        L.append(f"| adaptive `{arm}`, {name}: within `ponderlm`'s interval at every H, ≤ {FLOPS_SHARE:.0%} of its "
                 f"FLOPs per answer, exit within {EXIT_SLACK} of H for H ≤ 2, query symbols and filler by pass "
                 f"{EARLY_PASS} | accuracy " + ", ".join(f"{a.mean:.3f}" for a in accs)
                 + f" ({'inside or above' if within else 'below'}); FLOPs {share:.2f}×; exit H=1,2 {ex[0]:.2f}, "
                 f"{ex[1]:.2f}; query {q:.2f}, filler {f:.2f} | **{'met' if ok else 'not met'}** |")
    ref_ps = _ps(ref, "difficulty")
    for arm, name, ds, accs, ex, q, f, share in adaptive:  # the reasoning goal, judged on the differences' intervals
        diffs = [intervals.difference([d["per_symbol"] for d in ds], ref_ps, intervals.accuracy(h)) for h in LEVELS]
        close = all(d.low > -MARGIN for d in diffs)
        ok = close and share <= FLOPS_SHARE and q <= EARLY_PASS and f <= EARLY_PASS
        L.append(f"| goal: adaptive `{arm}`, {name}, within {MARGIN:.2f} of `ponderlm` at H = "
                 f"{', '.join(map(str, LEVELS))} (difference's lower bound above −{MARGIN:.2f}) at ≤ {FLOPS_SHARE:.2f}× its "
                 f"FLOPs per answer, query symbols and filler by pass {EARLY_PASS} | difference "
                 + ", ".join(f"H={h}: {d}" for h, d in zip(LEVELS, diffs))
                 + f"; FLOPs {share:.2f}×; query {q:.2f}, filler {f:.2f}; Spearman(difficulty, exit pass) "
                 f"{intervals.bootstrap([d['per_symbol'] for d in ds], intervals.spearman)} | "
                 f"**{'met' if ok else 'not met'}** |")
    return L + [""]


def _chosen_name(choice: QChoice) -> str:
    return f"Q-exit (q = {choice.q}, chosen on dev)"


def _choice_table(choices: Mapping[str, QChoice], verdicts: bool = True) -> list[str]:
    """q chosen on the development split (:mod:`.q_choice`): the differences to ``ponderlm`` there, at every q."""
    if not choices:
        return []
    L = ["", "### Q-exit's q, chosen on the development split\n",
         f"The smallest q at which the development accuracy's difference to `ponderlm` has its lower bound above "
         f"−{MARGIN:.2f} at H = {', '.join(map(str, LEVELS))} (else the q with the highest lower bound); the test split "
         "is then read at that q alone (the row `chosen on dev` above).\n",
         "| arm | q | runs | " + " | ".join(f"dev difference H={h}" for h in LEVELS) + " | chosen |",
         "|---|---:|---:|" + "---:|" * len(LEVELS) + "---|"]
    for arm, c in choices.items():
        for q, diffs in c.rows:
            mark = ("**chosen**" + ("" if c.met or not verdicts else " (criterion not met)")) if q == c.q else ""
            L.append(f"| {arm} | {q} | {c.runs} | " + " | ".join(map(str, diffs)) + f" | {mark} |")
    return L


def _own_rule(runs: Sequence[Mapping], choice: QChoice | None = None) -> tuple[str, list[Mapping]]:
    """The rule an arm is meant to run with: Q-exit at the q chosen on the development split where there is one,
    else Q-exit at q = 0.5 where it has halting heads, else all passes."""
    if choice is not None:
        return _chosen_name(choice), choice.test_runs(runs)
    name = "Q-exit (q = 0.5)" if runs[0].get("difficulty_q_exit") else "all passes"
    return name, [dict(rules_of(r))[name] for r in runs]


__all__ = ["best_adaponder", "rules_of", "section"]
