"""From what the rule found in each batch to what happens to it: the decisions of a screening.

Each pair's labels carry a trust in the manifest (the trigger writes it from the ledger, per pair
content): `trusted` and `benchmark` pairs are labels someone or something independent vouched for;
`new` pairs nobody has judged; `released` pairs were held and then let in by a named person.

Who may decide what (docs/screening.md, "Earning trust"):
- A model calibrated on trusted or benchmark labels is *independent*: its verdicts stand.
- Without such labels (the first drops) the model is *provisional*: it learned from labels nobody
  checked, maybe a drop exported with the wrong class map. Its word alone holds nothing wholesale.
  A batch of another team that mostly agrees with it *corroborates* it (two teams' labels agree):
  then its verdicts stand. A batch of another team that it contradicts wholesale is *disputed*
  (trained on, not trusted, the operator told); when batches of two or more other teams dispute it
  and none agrees, the batches it learned from are *outvoted* and held.
- Whatever the calibration, a batch's minority of contradicted pairs is left out (the rest of the
  batch agrees with the model, which is what makes the minority stand out), and a class the
  batch leaves unlabelled where the model sees it holds the batch: a model that never saw people
  cannot see them in anyone's images.
- Released pairs are judged and reported, never held again; pairs a team adds or replaces are
  new, whatever their batch's trust.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainer.screening.rule import BatchJudgement, Rule

INDEPENDENT, PROVISIONAL = "independent", "provisional"
# A batch's verdict.
OK, LEFT_OUT, HELD, DISPUTED, NOT_JUDGED, OUTVOTED = (
    "ok",
    "pairs left out",
    "held",
    "disputed",
    "not judged",
    "outvoted",
)


@dataclass(frozen=True)
class BatchCase:
    """One screened batch, as the decisions need it."""

    name: str
    team: str
    judgement: BatchJudgement
    released: frozenset[int] = frozenset()  # positions of released pairs: never held again


@dataclass
class Decision:
    verdict: str
    reasons: list[str]
    held: bool = False  # every new pair of the batch stays out
    left_out: list[int] = field(default_factory=list)  # positions of pairs left out
    independent: bool = False  # its passing pairs earn trust


@dataclass
class Decisions:
    batches: dict[str, Decision]
    corroborated_by: list[str]  # batches of other teams that agreed with a provisional model
    outvoted: list[str]  # the provisional model's own batches, held
    disputed: list[str]


def decide(
    cases: Sequence[BatchCase], calibration: str, basis_teams: frozenset[str], basis_batches: Sequence[str], rule: Rule
) -> Decisions:
    """Every batch's verdict (pure: the rules of docs/screening.md in one place)."""
    found = {case.name: _finding(case, rule) for case in cases}
    outsiders = [c for c in cases if c.team not in basis_teams]
    corroborated_by = [c.name for c in outsiders if found[c.name] in (OK, LEFT_OUT)]
    trusted_judge = calibration == INDEPENDENT or bool(corroborated_by)
    disputing_teams = {c.team for c in outsiders if found[c.name] == DISPUTED}
    outvoted = not trusted_judge and len(disputing_teams) >= 2
    decisions: dict[str, Decision] = {}
    for case in cases:
        decisions[case.name] = _decision(
            case,
            found[case.name],
            trusted_judge=trusted_judge,
            outvoted=outvoted,
            basis_batches=basis_batches,
            rule=rule,
        )
    held_basis = sorted(basis_batches) if outvoted else []
    for name in held_basis:
        teams = ", ".join(sorted(disputing_teams))
        why = (
            f"outvoted: the batches of teams {teams} contradict the model trained on it, and no batch of another "
            "team agrees with that model"
        )
        if name in decisions:
            decisions[name] = Decision(OUTVOTED, [why, *decisions[name].reasons[:1]], held=True)
        else:
            decisions[name] = Decision(OUTVOTED, [why], held=True)
    return Decisions(
        batches=decisions,
        corroborated_by=corroborated_by if calibration == PROVISIONAL else [],
        outvoted=held_basis,
        disputed=sorted(n for n, d in decisions.items() if d.verdict == DISPUTED),
    )


def _finding(case: BatchCase, rule: Rule) -> str:
    """What the rule says on its own: not judged, erased (kept as HELD), wholesale (DISPUTED
    until the judge is trusted), a minority of pairs (LEFT_OUT) or nothing (OK)."""
    judgement = case.judgement
    if judgement.judged == 0 or judgement.judged < rule.min_judged_share * judgement.pairs:
        return NOT_JUDGED
    if any(f.kind == "erased" for f in judgement.findings):
        return HELD
    if judgement.contradicted_share >= rule.batch_margin or judgement.findings:
        return DISPUTED
    return LEFT_OUT if judgement.contradicted else OK


def _decision(
    case: BatchCase, found: str, *, trusted_judge: bool, outvoted: bool, basis_batches: Sequence[str], rule: Rule
) -> Decision:
    j = case.judgement
    share = (
        f"{len(j.contradicted)} of its {j.judged} judged pairs contradict the accepted model beyond its usual "
        f"confusions ({100 * j.contradicted_share:.0f} %; held from {100 * rule.batch_margin:.0f} %)"
    )
    findings = [f.text for f in j.findings]
    new_contradicted = [i for i in j.contradicted if i not in case.released]
    if found == NOT_JUDGED:
        why = (
            f"not judged: the model is confident on too little of {j.pairs - j.judged} of its {j.pairs} pairs "
            "(scenes it does not know): trained on, not trusted, screened again by the next accepted model"
        )
        return Decision(NOT_JUDGED, [why], left_out=new_contradicted)
    if found == HELD or (found == DISPUTED and trusted_judge):
        if case.released and len(case.released) == j.pairs:
            return Decision(OK, [*findings, share, "released by a person: trained on, never held again"])
        return Decision(HELD, [*findings, share], held=True)
    if found == DISPUTED:
        return _disputed(findings, share, outvoted=outvoted, basis_batches=basis_batches)
    if found == LEFT_OUT:
        why = f"{len(new_contradicted)} pairs left out for their team to fix; the rest trained on ({share})"
        return Decision(LEFT_OUT, [why], left_out=new_contradicted, independent=trusted_judge)
    usual = f"within what the model shows on labels it did not learn from ({share})"
    return Decision(OK, [usual], independent=trusted_judge)


def _disputed(findings: list[str], share: str, *, outvoted: bool, basis_batches: Sequence[str]) -> Decision:
    """A batch a provisional model contradicts wholesale: its word alone holds nothing."""
    against = ", ".join(sorted(basis_batches)) or "the batches it learned from"
    if outvoted:
        why = f"contradicts a model that other teams outvoted ({against}): trained on, not trusted yet"
        return Decision(OK, [why, *findings])
    why = (
        f"disputed: it contradicts the provisional model trained on {against} wholesale, and no independent "
        "labels say which is right: trained on, not trusted. Decide: name a benchmark of labels checked by hand "
        "(`retrain data benchmark`), or hold the wrong side (`retrain data hold`)"
    )
    return Decision(DISPUTED, [why, *findings, share])


def summary_counts(decisions: Mapping[str, Decision]) -> dict[str, list[str]]:
    """Batch names by verdict, for logs and metrics.json."""
    by: dict[str, list[str]] = {}
    for name, decision in sorted(decisions.items()):
        by.setdefault(decision.verdict, []).append(name)
    return by
