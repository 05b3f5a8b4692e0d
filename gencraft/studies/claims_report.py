"""``claims.md``: the claims table (one row per claim, the verdict computed), then each
claim's comparisons, notes and pre-registered plan."""

from __future__ import annotations

from typing import Any

from gencraft.metrics.stats import VERDICTS

COLUMNS = (
    "id",
    "paper",
    "claim",
    "unit",
    "effect [95%]",
    "p (Holm)",
    "units",
    "scale",
    "verdict",
    "decide",
)


def _num(x: float | None) -> str:
    return "–" if x is None or x != x else f"{x:+.3g}"


def _effect(row: dict[str, Any]) -> str:
    if row["effect"] is None:
        return "–"
    return f"{_num(row['effect'])} [{_num(row['low'])}, {_num(row['high'])}]"


def _units(row: dict[str, Any], named: bool = False) -> str:
    """The independent units' count (with their name), and a two-level result's count of
    second-level units within each."""
    within = row.get("within")
    name = f" {row['unit']}s" if named else ""
    return f"{row['units']}{name}" + (f" ({within:,} within each)" if within else "")


def _cells(row: dict[str, Any]) -> list[str]:
    verdict = f"**{row['verdict']}**" + (f" ({row['why']})" if row.get("why") else "")
    return [
        row["id"],
        row["paper"],
        row["claim"],
        row["unit"],
        _effect(row),
        row.get("p_text", "–"),
        _units(row) if row["units"] else "–",
        row["scale"],
        verdict,
        row["decide"] or "–",
    ]


def verdict_counts(rows: list[dict[str, Any]]) -> str:
    got = {w: sum(r["verdict"] == w for r in rows) for w in VERDICTS}
    return ", ".join(f"{n} {w}" for w, n in got.items() if n)


def _detail(row: dict[str, Any]) -> list[str]:
    lines = [f"### {row['id']}", "", f"{row['paper']}: {row['claim']}.", ""]
    rep = row["reported"]
    lines.append(
        f"- The paper: {rep['table']}, {rep['effect']} ({rep['model']}; {rep['data']}; "
        f"training: {rep['training']})."
    )
    if row.get("comparison"):
        lines.append(
            f"- Primary: {row['comparison']}, {_effect(row)}, {_p(row['p_text'])} "
            f"(Holm; unadjusted {row['p_raw']:.3g}), {_units(row, True)}."
        )
    for s in row["secondary"]:
        lines.append(
            f"- Secondary: {s['comparison']}, {_num(s['effect'])} "
            f"[{_num(s['low'])}, {_num(s['high'])}], {_p(s['p_text'])} (Holm), "
            f"{_units(s, True)}."
        )
    lines += [f"- {label}: {text}" for label, text in row.get("details", [])]
    lines += [f"- {n}" for n in row["notes"]]
    if row.get("files"):
        lines.append("- Read from: " + ", ".join(f"`docs/results/runs/{f}`" for f in row["files"]))
    if row["plan"]:
        p = row["plan"]
        lines.append(
            f"- **Pre-registered** ({p['registered']}): endpoint {p['endpoint']}; unit "
            f"{p['unit']}; test {p['test']}; α = {p['alpha']}; size {p['size']}; "
            f"stopping: {p['stopping']}; `{p['command']}` ({p['cost']}). Secondary, "
            f"under Holm: {'; '.join(p['secondary']) or 'none'}. Anything else is "
            "exploratory."
        )
        lines += [f"- Amended: {a}" for a in p.get("amended", ())]
    return [*lines, ""]


def claims_markdown(rows: list[dict[str, Any]]) -> str:
    """The whole claims.md."""
    head = [
        "# Claims and verdicts",
        "",
        "Written by `gencraft reproduce claims --output DIR` from the committed runs under "
        "docs/results/runs (no model runs). Each verdict is one rule "
        "(`gencraft.metrics.stats.verdict`) on the claim's primary comparison, on its "
        "independent unit, its p adjusted by Holm over the claim's comparisons: "
        "`reproduced`, `contradicted` (only at a scale that decides the claim), "
        "`excluded at this scale`, `undecided`, `not attempted`. A p at its resampling "
        'floor is written "< 1/R".',
        "",
        f"{len(rows)} claims: {verdict_counts(rows)}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    table = ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    details = ["", "## Each claim", ""]
    for r in rows:
        details += _detail(r)
    return "\n".join([*head, *table, *details]).rstrip() + "\n"


#: results page -> the claim-id prefixes it reports
PAGES = {
    "recurrence.md": ("recurrence-",),
    "hso.md": ("hso",),
    "nar.md": ("rum-sundae",),
    "search.md": ("bad-mode", "empty-mode", "search-errors", "dfs-", "conditional-"),
    "focus.md": ("fame-", "focus-"),
    "pointer.md": ("pointer-",),
    "prefix.md": ("dasp-",),
}
START, END = "<!-- claims: written by gencraft reproduce claims -->", "<!-- /claims -->"


def page_block(rows: list[dict[str, Any]], page: str) -> str:
    """The opening block of a results page: its claims' lines from claims.md."""
    mine = [r for r in rows if r["id"].startswith(PAGES[page])]
    lines = [START, "", "The claims this page measures ([claims.md](claims.md) decides them):", ""]
    for r in mine:
        effect = "" if r["effect"] is None else f": {_effect(r)}, {_p(r['p_text'])} (Holm), "
        within = f"; {r['within']:,} within each" if r.get("within") else ""
        units = "" if not r["units"] else f"{r['units']} independent units ({r['unit']}{within})"
        lines.append(f"- `{r['id']}`, {r['claim']}{effect}{units}: **{r['verdict']}**.")
    return "\n".join([*lines, "", END])


def update_pages(rows: list[dict[str, Any]], folder: Any) -> list[Any]:
    """Rewrite the claims block of each results page found in ``folder`` (pages without the
    block are left alone); returns the pages rewritten."""
    done = []
    for page in PAGES:
        path = folder / page
        if not path.is_file() or START not in (text := path.read_text()):
            continue
        head, rest = text.split(START, 1)
        path.write_text(head + page_block(rows, page) + rest.split(END, 1)[1])
        done.append(path)
    return done


def _p(text: str) -> str:
    """ "p = 0.012", or "p < 0.0001" where p sits at its resampling floor."""
    return f"p {text}" if text.startswith("<") else f"p = {text}"
