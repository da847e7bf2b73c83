"""Checks of scripts/apifuzz.sh beside Schemathesis' own (they run with --checks all).

promotion.toml lets POST /promotions answer 422 to a request its schema accepts, because the
document states rules a JSON Schema cannot: EndsAt after StartsAt, the years 0001..9999 in UTC
(0001-01-01T00:00:00Z excluded), distinct targets, and an Idempotency-Key reused with another
body. The first check holds that allowance to exactly those rules. The second fails the run when
an operation never answered 2xx, so that a stateful phase that stops reaching a real purchase or
card fails instead of passing on 404s.
"""

import re

import schemathesis

# Each rule the document states in words, as the API names it in a validation_failed answer.
STATED_RULES = [
    (re.compile(r"^EndsAt$"), "must be after StartsAt"),
    (re.compile(r"^(StartsAt|EndsAt)$"), "must be within 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z in UTC"),
    (re.compile(r"^(StartsAt|EndsAt)$"), "must be after 0001-01-01T00:00:00Z, which stands for none"),
    (re.compile(r"^Targets\[[0-9]+\]$"), "duplicate target"),
]


def _stated(field):
    return any(name.match(field.get("field", "")) and field.get("problem") == problem for name, problem in STATED_RULES)


@schemathesis.check
def refused_only_by_a_stated_rule(ctx, response, case):
    """A schema-valid purchase answered 422 breaks one of the rules the document states."""
    meta = case.meta
    if case.operation.label != "POST /promotions" or response.status_code != 422:
        return None
    if meta is None or not meta.generation.mode.is_positive:
        return None
    body = response.json()
    if body.get("code") == "idempotency_key_reused":
        return None
    fields = body.get("fields") or []
    if body.get("code") != "validation_failed" or not fields or not all(_stated(f) for f in fields):
        raise AssertionError(
            "a request the schema accepts was refused by a rule the document does not state: " + response.text
        )
    return None


@schemathesis.check
class EveryOperationAnswers2xx:
    """Every operation tested answered 2xx at least once in the run."""

    def __init__(self):
        self.tested = set()
        self.answered = set()

    def after_response(self, ctx, response, case):
        self.tested.add(case.operation.label)
        if 200 <= response.status_code < 300:
            self.answered.add(case.operation.label)

    def after_run(self, ctx):
        never = sorted(self.tested - self.answered)
        if never:
            raise AssertionError("never answered 2xx: " + ", ".join(never))
