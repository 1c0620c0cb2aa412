"""axe-core (Deque's accessibility engine) run in a Playwright page.

The engine is the npm package ``axe-core``, pinned in ``package.json`` and locked in
``package-lock.json`` (installed by ``npm ci`` with the proxy); it is injected from
``node_modules``, never fetched at run time.
"""

from __future__ import annotations

from typing import Any

from tests.support import REPO

AXE_JS = REPO / "node_modules" / "axe-core" / "axe.min.js"
#: WCAG 2.0, 2.1 and 2.2 levels A and AA, plus Deque's best practices (landmarks, names).
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]
#: The impacts a page must have none of.
BLOCKING = ("serious", "critical")


def axe_violations(page, include: str | None = None) -> list[dict[str, Any]]:
    """axe-core's violations on ``page`` (within the CSS selector ``include``, else the whole document)."""
    if not AXE_JS.exists():
        raise AssertionError(f"{AXE_JS} is missing: run `npm ci` in the repository root")
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE_JS))
    return page.evaluate(
        """async ([include, tags]) => {
            const result = await axe.run(include ? { include: [include] } : document,
                                         { runOnly: { type: 'tag', values: tags }, resultTypes: ['violations'] });
            return result.violations.map(v => ({
                id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.map(n => ({ target: n.target.join(' '), summary: n.failureSummary }))
            }));
        }""",
        [include, AXE_TAGS],
    )


def blocking(violations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The serious and critical ones."""
    return [v for v in violations if v["impact"] in BLOCKING]


def describe(violations: list[dict[str, Any]]) -> str:
    """One line per violation and node, for an assertion message."""
    lines = []
    for v in violations:
        for n in v["nodes"]:
            lines.append(f"{v['impact']} {v['id']} ({v['help']}): {n['target']}: {n['summary']}")
    return "\n".join(lines)
